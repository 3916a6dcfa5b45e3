# ctitan — the two README commands and friends.
#   make run    set up, build, train the debug model briefly (the main job)
#   make test   set up, build, run the whole test suite (CTest)
#   make bench  benchmarks against PyTorch on this machine
#   make asan   the suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make tsan   the comm tests (threads: comm stream, watchdog, counters, flight recorder) under
#               ThreadSanitizer
#   make build  build only
# make build and make run install only what building and running need (scripts/install-deps.sh);
# make test, asan, tsan and bench add the test-only packages (scripts/install-deps.sh --test).
# CMake generates the build and CTest runs the suite: it gives per-test timeouts, MPI launch
# lines and environments, and parallel runs for free; this Makefile only fixes the entry points.

BUILD_DIR ?= build
ASAN_DIR ?= build-asan
TSAN_DIR ?= build-tsan
JOBS ?= $(shell nproc)
CTEST_ARGS ?=

.PHONY: all deps deps-test build compile run test bench asan tsan clean

all: build

deps:
	@bash scripts/install-deps.sh

deps-test:
	@bash scripts/install-deps.sh --test

# The Release build without installing anything (build and test each install their set first).
compile:
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release > /dev/null
	@cmake --build $(BUILD_DIR) -j $(JOBS)

build: deps
	@$(MAKE) --no-print-directory compile

run: build
	@bash scripts/run.sh $(BUILD_DIR)/ctitan

test: deps-test
	@$(MAKE) --no-print-directory compile
	@cd $(BUILD_DIR) && ctest --output-on-failure $(CTEST_ARGS)

bench: deps-test
	@$(MAKE) --no-print-directory compile
	@bash bench/run.sh $(BUILD_DIR)

asan: deps-test
	@cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=Asan > /dev/null
	@cmake --build $(ASAN_DIR) -j $(JOBS)
	@cd $(ASAN_DIR) && CT_ASAN=1 ctest --output-on-failure $(CTEST_ARGS)

# OpenMP runs one thread per rank here: libgomp is not instrumented, so its barriers would
# read as races; the comm layer's own threads are what this checks.
tsan: deps-test
	@cmake -S . -B $(TSAN_DIR) -DCMAKE_BUILD_TYPE=Tsan > /dev/null
	@cmake --build $(TSAN_DIR) -j $(JOBS) --target test_comm test_flight
	@cd $(TSAN_DIR) && CT_TSAN=1 ctest --output-on-failure -R '^(comm|flight)_np' $(CTEST_ARGS)

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR)
