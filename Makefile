# coremesh: `make run` and `make test` install what is missing, configure,
# build and run. Build trees: build/ (release), build-tsan/, build-asan/.
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
ifneq ($(CI),)
  CMAKE_FLAGS += -DCOREMESH_WERROR=ON
endif

.PHONY: all deps build run test test-unit test-tsan test-asan bench clean

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build build -j $(JOBS)

# The main job: train the demo MoE on the Bible (scripts/run-demo.sh).
run: build
	@bash scripts/run-demo.sh

# Every test: the whole suite, then the runtime under ThreadSanitizer and the
# layers under AddressSanitizer + UndefinedBehaviorSanitizer, SHMEM's
# multi-process tests (PEs and C programs under `coremesh run`) included.
test: test-unit test-tsan test-asan

test-unit: build
	@cd build && ctest --output-on-failure -j $(JOBS) --timeout 600

test-tsan: deps
	@cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCOREMESH_SANITIZE=thread \
	  -DCOREMESH_BENCH=OFF $(CMAKE_FLAGS) >/dev/null
	@cmake --build build-tsan -j $(JOBS) --target test_runtime test_graph
	@cd build-tsan && TSAN_OPTIONS="halt_on_error=1" ctest --output-on-failure -j $(JOBS) -L "runtime|graph"

test-asan: deps
	@cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCOREMESH_SANITIZE=address \
	  -DCOREMESH_BENCH=OFF $(CMAKE_FLAGS) >/dev/null
	@cmake --build build-asan -j $(JOBS) --target test_core test_runtime test_ops test_graph test_parallel \
	  test_parallel_pe test_model test_train test_cli coremesh test_shmem_pe test_shmem_unit shmem_fault_prog
	@cd build-asan && ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1" \
	  ctest --output-on-failure -j $(JOBS) -L "core|runtime|ops|graph|parallel|model|train|cli|shmem"

# Benchmarks, each beside its peer in the same run; results and the commands
# that made them go to docs/performance.md (one section per script).
bench: build
	@bash bench/run_runtime_bench.sh
	@bash bench/run_python_bench.sh
	@bash bench/run_ops_bench.sh --write
	@bash bench/run_graph_bench.sh
	@out=$$(bash bench/run_shmem_bench.sh build) && echo "$$out" && \
	  python3 scripts/update_perf_section.py SHMEM "bash bench/run_shmem_bench.sh build" "$$out"
	@out=$$(bash bench/train_vs_torch.sh) && echo "$$out" && \
	  python3 scripts/update_perf_section.py Training "bash bench/train_vs_torch.sh" "$$out"
	@out=$$(bash bench/train_parallel.sh) && echo "$$out" && \
	  python3 scripts/update_perf_section.py "Parallel training" "bash bench/train_parallel.sh" "$$out"

clean:
	rm -rf build build-tsan build-asan out
