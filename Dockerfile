# syntax=docker/dockerfile:1
# Images of EDiT on Kubernetes. Two targets:
#   docker build --target runtime  -t edit-runtime .   # edit-train, edit-run, edit-data
#   docker build --target operator -t edit-operator .  # edit-operator
# CPU (default): Debian bookworm, Debian's LibTorch 1.13.
# GPU: a Debian-based CUDA image that has PyTorch installed (its LibTorch and NCCL are used):
#   docker build --target runtime --build-arg BASE=<cuda+pytorch image> --build-arg EDIT_WITH_CUDA=ON .
# Dependencies come from scripts/install-deps.sh, the same script the README and CI use;
# final images get only the shared libraries (install-deps.sh --runtime) and run as uid 65532.

ARG BASE=debian:bookworm

# ---------------------------------------------------------------- build dependencies
FROM ${BASE} AS deps
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY scripts/install-deps.sh /src/scripts/install-deps.sh
RUN /src/scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*

# ---------------------------------------------------------------- build
FROM deps AS build-runtime
ARG EDIT_WITH_CUDA=OFF
COPY . /src
# With CUDA, LibTorch is the one inside the base image's PyTorch.
RUN prefix=""; \
    if [ "${EDIT_WITH_CUDA}" = "ON" ]; then \
      prefix="-DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"; \
    fi; \
    cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DEDIT_BUILD_TESTS=OFF -DEDIT_BUILD_OPERATOR=OFF -DEDIT_WITH_CUDA="${EDIT_WITH_CUDA}" \
      -DCMAKE_RUNTIME_OUTPUT_DIRECTORY=/build/bin ${prefix} \
 && cmake --build /build --target edit-train edit-run edit-data \
 && strip --strip-unneeded /build/bin/edit-train /build/bin/edit-run /build/bin/edit-data

FROM deps AS build-operator
COPY . /src
RUN cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DEDIT_BUILD_TESTS=OFF -DEDIT_BUILD_RUNTIME=OFF \
      -DCMAKE_RUNTIME_OUTPUT_DIRECTORY=/build/bin \
 && cmake --build /build --target edit-operator \
 && strip --strip-unneeded /build/bin/edit-operator

# ---------------------------------------------------------------- runtime image
FROM ${BASE} AS runtime
COPY scripts/install-deps.sh /usr/local/lib/edit/install-deps.sh
RUN /usr/local/lib/edit/install-deps.sh --runtime \
 && rm -rf /var/lib/apt/lists/* /usr/local/lib/edit \
 && groupadd --gid 65532 edit && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin edit \
 && install -d -o 65532 -g 65532 /work
COPY --from=build-runtime /build/bin/edit-train /build/bin/edit-run /build/bin/edit-data /usr/local/bin/
# Fills a data volume with the Brown corpus (examples/cluster/prepare-data.yaml).
COPY scripts/prepare-data.sh /usr/local/bin/edit-prepare-data
WORKDIR /work
USER 65532:65532
# The operator sets the pod's command (spec.command, default edit-train) and EDIT_CONFIG.
CMD ["edit-train"]

# ---------------------------------------------------------------- operator image
# Build it with the default BASE: the operator needs no GPU.
FROM ${BASE} AS operator
COPY scripts/install-deps.sh /usr/local/lib/edit/install-deps.sh
RUN /usr/local/lib/edit/install-deps.sh --runtime \
 && rm -rf /var/lib/apt/lists/* /usr/local/lib/edit \
 && groupadd --gid 65532 edit && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin edit
COPY --from=build-operator /build/bin/edit-operator /usr/local/bin/edit-operator
USER 65532:65532
EXPOSE 8080 8081 9090
ENTRYPOINT ["/usr/local/bin/edit-operator"]
