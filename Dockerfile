# syntax=docker/dockerfile:1
# Images of EDiT on Kubernetes. Two targets:
#   docker build --target runtime  -t edit-runtime .   # edit-train, edit-run, edit-data, edit-export
#   docker build --target operator -t edit-operator .  # edit-operator (no LibTorch)
# Podman and Buildah read the same file (podman build / buildah bud). Without a registry,
# scripts/build-images.sh makes a local Debian base and passes BASE=localhost/debian:bookworm.
# CPU (default): Debian bookworm, Debian's LibTorch 1.13.
# GPU: a Debian-based CUDA image that has PyTorch installed (its LibTorch and NCCL are used):
#   docker build --target runtime --build-arg BASE=<cuda+pytorch image> --build-arg EDIT_WITH_CUDA=ON .
# Dependencies come from scripts/install-deps.sh, the same script the README and CI use
# (--build in the build stages, --runtime / --operator in the images); final images hold
# only shared libraries and binaries and run as uid 65532.

ARG BASE=debian:bookworm

# ---------------------------------------------------------------- build dependencies
# Only install-deps.sh is copied here, so this (slow) layer stays cached until it changes.
FROM ${BASE} AS deps
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY scripts/install-deps.sh /src/scripts/install-deps.sh
RUN /src/scripts/install-deps.sh --build && rm -rf /var/lib/apt/lists/*

# ---------------------------------------------------------------- build
# Each build stage copies only the sources it compiles: edits to tests, docs or scripts
# do not invalidate the (long) compile layer. EDIT_BUILD_JOBS: parallel compile jobs
# (empty: ninja's default, one per core).
FROM deps AS build-runtime
ARG EDIT_WITH_CUDA=OFF
ARG EDIT_BUILD_JOBS=
COPY CMakeLists.txt /src/CMakeLists.txt
COPY common /src/common
COPY proto /src/proto
COPY runtime /src/runtime
# With CUDA, LibTorch is the one inside the base image's PyTorch.
RUN prefix=""; \
    if [ "${EDIT_WITH_CUDA}" = "ON" ]; then \
      prefix="-DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"; \
    fi; \
    cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DEDIT_BUILD_TESTS=OFF -DEDIT_BUILD_OPERATOR=OFF -DEDIT_WITH_CUDA="${EDIT_WITH_CUDA}" \
      -DCMAKE_RUNTIME_OUTPUT_DIRECTORY=/build/bin ${prefix} \
 && cmake --build /build ${EDIT_BUILD_JOBS:+-j ${EDIT_BUILD_JOBS}} \
      --target edit-train edit-run edit-data edit-export \
 && strip --strip-unneeded /build/bin/edit-train /build/bin/edit-run /build/bin/edit-data /build/bin/edit-export

FROM deps AS build-operator
ARG EDIT_BUILD_JOBS=
COPY CMakeLists.txt /src/CMakeLists.txt
COPY common /src/common
COPY proto /src/proto
COPY operator /src/operator
RUN cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DEDIT_BUILD_TESTS=OFF -DEDIT_BUILD_RUNTIME=OFF \
      -DCMAKE_RUNTIME_OUTPUT_DIRECTORY=/build/bin \
 && cmake --build /build ${EDIT_BUILD_JOBS:+-j ${EDIT_BUILD_JOBS}} --target edit-operator \
 && strip --strip-unneeded /build/bin/edit-operator

# ---------------------------------------------------------------- runtime image
FROM ${BASE} AS runtime
COPY scripts/install-deps.sh /usr/local/lib/edit/install-deps.sh
RUN /usr/local/lib/edit/install-deps.sh --runtime \
 && rm -rf /var/lib/apt/lists/* /usr/local/lib/edit \
 && groupadd --gid 65532 edit && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin edit \
 && install -d -o 65532 -g 65532 /work
COPY --from=build-runtime /build/bin/edit-train /build/bin/edit-run /build/bin/edit-data /build/bin/edit-export /usr/local/bin/
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
RUN /usr/local/lib/edit/install-deps.sh --operator \
 && rm -rf /var/lib/apt/lists/* /usr/local/lib/edit \
 && groupadd --gid 65532 edit && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin edit
COPY --from=build-operator /build/bin/edit-operator /usr/local/bin/edit-operator
USER 65532:65532
EXPOSE 8080 8081 9090
ENTRYPOINT ["/usr/local/bin/edit-operator"]
