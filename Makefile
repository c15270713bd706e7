# Quick start: `make run` (set-up, build, main job) and `make test` (set-up, build, every test).
# Both install what is missing first (scripts/setup.sh, pinned), then build incrementally.
BUILD ?= build
PY := .deps/venv/bin/python
CUTLASS_INCLUDE := $(CURDIR)/.deps/cutlass-4.2.0.0/include
JOBS ?= $(shell nproc)
# nvcc from the standard toolkit location when it is not on PATH already.
export PATH := $(PATH):/usr/local/cuda/bin

.PHONY: all setup configure build run test test-cpp test-python python-install gpu sanitize clean

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -DGDNKIT_BUILD_PYTHON=ON -DPython_EXECUTABLE=$(CURDIR)/$(PY) \
	  -DGDNKIT_CUTLASS_DIR=$(CUTLASS_INCLUDE) -DGDNKIT_SPILL_CHECK=ON

configure: $(BUILD)/build.ninja

build: setup configure
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/gdnkit

test: build test-cpp test-python

test-cpp: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-python: build
	PYTHONPATH=$(BUILD)/python $(PY) -m pytest tests/python -q

# Builds and installs the Python package into the project's venv through pip (scikit-build-core).
python-install: setup
	$(PY) -m pip install --no-build-isolation -v . 

# On a machine with a GPU: build, GPU tests, benchmark (see scripts/gpu_check.sh).
gpu:
	bash scripts/gpu_check.sh

# The CPU and emulator tests under AddressSanitizer and UndefinedBehaviorSanitizer (no GPU needed;
# about 12 minutes on two cores): every host-side read and write of the kernels' logic is checked.
sanitize: setup
	cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=Release -DGDNKIT_WITH_CUDA=OFF \
	  -DGDNKIT_BUILD_PYTHON=OFF -DGDNKIT_BUILD_BENCH=OFF -DGDNKIT_BUILD_CLI=OFF \
	  "-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined
	cmake --build build-sanitize -j $(JOBS) --target gdnkit_cpu_tests gdnkit_emu_tests
	./build-sanitize/tests/gdnkit_cpu_tests
	./build-sanitize/tests/gdnkit_emu_tests

clean:
	rm -rf $(BUILD)
