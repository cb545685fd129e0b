# coremesh: `make run` and `make test` install what is missing, configure,
# build and run. Build trees: build/ (release), build-tsan/, build-asan/.
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
ifneq ($(CI),)
  CMAKE_FLAGS += -DCOREMESH_WERROR=ON
endif

.PHONY: all deps deps-run build build-run run test test-unit test-tsan test-asan fuzz bench clean install package

all: build

deps:
	@bash scripts/install-deps.sh

deps-run:
	@bash scripts/install-deps.sh run

# Everything: libraries, the executable, tests, benchmarks, the Python module.
build: deps
	@cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOREMESH_TESTS=ON -DCOREMESH_BENCH=ON \
	  -DCOREMESH_PYTHON=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build build -j $(JOBS)

# What the main job needs: the coremesh executable only (the same build tree;
# `make test` adds the rest to it).
build-run: deps-run
	@cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOREMESH_TESTS=OFF -DCOREMESH_BENCH=OFF \
	  -DCOREMESH_PYTHON=OFF $(CMAKE_FLAGS) >/dev/null
	@cmake --build build -j $(JOBS) --target coremesh

# `make install PREFIX=P` (default /usr/local): the release build into P
# (relocatable: P may be moved later). `make package`: the .deb, build/coremesh_*.deb.
PREFIX ?= /usr/local
install: build
	@cmake --install build --prefix $(PREFIX)

package: build
	@cd build && cpack

# The main job: train the demo MoE on the Bible (scripts/run-demo.sh).
run: build-run
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
	  test_parallel_pe test_train_pe test_model test_train test_cli coremesh test_shmem_pe test_shmem_unit shmem_fault_prog \
	  test_bad_input
	@cd build-asan && ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1" \
	  ctest --output-on-failure -j $(JOBS) -L "core|runtime|ops|graph|parallel|model|train|cli|shmem|fuzz"

# libFuzzer on the bad-input targets (fuzz/bad_input.hpp): a clang tree
# (build-fuzz/, coverage + ASan + UBSan), then FUZZ_SECONDS per target from
# seeds the project's own writers make (docs/reliability.md, "Bad input").
FUZZ_SECONDS ?= 60
fuzz:
	@bash scripts/install-deps.sh fuzz
	@cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" \
	  -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCOREMESH_FUZZ=ON \
	  -DCOREMESH_TESTS=OFF -DCOREMESH_BENCH=OFF -DCOREMESH_PYTHON=OFF $(CMAKE_FLAGS) >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzz_write_seeds fuzz_config fuzz_schedule fuzz_safetensors fuzz_data
	@bash scripts/run_fuzzers.sh build-fuzz $(FUZZ_SECONDS)

# Benchmarks, each beside its peer in the same run. `make bench` runs every
# area in turn (never two at once: they share the cores), `make bench-<area>`
# one of them. Each script prints its table; scripts/update_perf_section.py puts
# it, with the command and the date, between the area's markers in
# docs/performance.md and leaves the text around them as it is.
BENCH_AREAS := runtime python kernels graph graph-training shmem shmem-net training parallel \
  ep-exchange moe-replicas expert-balance router-bias pipeline tp tp-traffic fused-comm fused-chunks tuner cp memory
# $(call perf_section,NAME,COMMAND): run COMMAND (no commas or double quotes in
# it), show its table and write it into block NAME; a failing COMMAND writes nothing.
perf_section = out=$$($(2)) && echo "$$out" && python3 scripts/update_perf_section.py "$(1)" "$(2)" "$$out"
.PHONY: $(addprefix bench-,$(BENCH_AREAS))

bench:
	@$(MAKE) --no-print-directory -j1 $(addprefix bench-,$(BENCH_AREAS))

bench-runtime: build
	@$(call perf_section,Runtime,bash bench/run_runtime_bench.sh)
bench-python: build
	@$(call perf_section,Python,bash bench/run_python_bench.sh)
bench-kernels: build
	@$(call perf_section,Kernels,bash bench/run_ops_bench.sh)
bench-graph: build
	@$(call perf_section,Graph replay,bash bench/run_graph_bench.sh)
bench-graph-training: build
	@$(call perf_section,Graph mode training,bash bench/train_graph.sh 20 5)
bench-shmem: build
	@$(call perf_section,SHMEM,bash bench/run_shmem_bench.sh build)
bench-shmem-net: build
	@$(call perf_section,SHMEM network,bash bench/run_shmem_net_bench.sh build 3)
bench-training: build
	@$(call perf_section,Training,bash bench/train_vs_torch.sh 20 3)
bench-parallel: build
	@$(call perf_section,Parallel training,bash bench/train_parallel.sh 12 3)
bench-ep-exchange: build
	@$(call perf_section,EP exchange,bash bench/ep_exchange.sh 5 300)
bench-moe-replicas: build
	@$(call perf_section,MoE replicas,bash bench/moe_replicas.sh 8 3)
bench-expert-balance: build
	@$(call perf_section,Expert balance,bash bench/expert_balance.sh 8 3)
bench-router-bias: build
	@$(call perf_section,Router bias,bash bench/router_bias.sh 2)
bench-pipeline: build
	@$(call perf_section,Pipeline parallelism,bash bench/pipeline_bubble.sh 6 3)
bench-tp: build
	@$(call perf_section,Tensor parallel,bash bench/train_tp_cp.sh 12 3)
bench-tp-traffic: build
	@$(call perf_section,Tensor parallel traffic,bash bench/tp_training.sh 8 128 3)
bench-fused-comm: build
	@$(call perf_section,Fused communication,bash bench/fused_comm.sh 12 3)
bench-fused-chunks: build
	@$(call perf_section,Fused all-reduce chunks,bash bench/fused_chunks.sh 3)
bench-tuner: build
	@$(call perf_section,Tiling auto-tuner,bash bench/tuner.sh 12 3)
bench-cp: build
	@$(call perf_section,Context parallel,bash bench/cp_attention.sh 4096 3)
bench-memory: build
	@$(call perf_section,Memory per rank,python3 bench/memory_layouts.py)

clean:
	rm -rf build build-tsan build-asan build-fuzz out
