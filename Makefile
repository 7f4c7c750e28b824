# The two commands of the README:
#   make quickstart   install deps, build, fetch the Brown corpus, train `tiny` with EDiT on 4 local workers
#   make test         install deps, build everything, run every test (ctest), plus the
#                     ASan/UBSan unit tests and a bounded fuzzing run
#   make images       build the container images (scripts/build-images.sh) and check them
#                     (ctest -L image); not part of make test (CI's time budget)
BUILD ?= build
JOBS  ?= 2
CMAKE_FLAGS ?=

.PHONY: deps configure build runtime data quickstart test test-unit sanitize tsan images clean

deps:
	scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Only what the local training needs (quickstart does not wait for the operator and tests).
runtime: configure
	cmake --build $(BUILD) -j $(JOBS) --target edit-train edit-run edit-data

data: runtime
	EDIT_DATA_BIN=$(BUILD)/runtime/edit-data scripts/prepare-data.sh

quickstart: data
	$(BUILD)/runtime/edit-run --nproc 4 --config examples/local/tiny.yaml

# ASan+UBSan unit tests, bounded fuzzing and the ThreadSanitizer run of the job store
# first, so ctest's summary of the whole suite is the last line of the output. Label image is left to `make images`: it checks
# images that make test does not build (ones on the machine may be stale).
test: build data sanitize tsan
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900 -LE image

sanitize: deps
	FUZZ_SECONDS=$${FUZZ_SECONDS:-10} scripts/ci-sanitize.sh

tsan: deps
	scripts/ci-tsan.sh

test-unit: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L unit

# The runtime and operator images (Buildah, a local debootstrap base; the first build
# compiles for a long time, later ones reuse the cached layers), then their checks: inside
# the images, and an EDiTJob whose pods run in the runtime image on the API stand-in.
images: build
	scripts/build-images.sh
	cd $(BUILD) && ctest --output-on-failure --timeout 900 -L image

clean:
	rm -rf $(BUILD)
