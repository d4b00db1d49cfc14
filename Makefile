# kvdrive: the commands of the README. Each installs what it needs (scripts/bootstrap) first.
#   make demo        the main job: SmolLM2-135M reads a ~4K-token real document in tiered mode
#                    (fast DRAM + DRAM + SSD) through KvManager and answers a question about it,
#                    then prints whether the answer is right and its summary
#   make test        build everything (nvcc included where present) and run the test suite
#   make quick-test  the library's own tests alone (ctest label `quick`): a few minutes, no model,
#                    no decoder, no CUDA; make test still runs everything
#   make asan-test   the test suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make tsan-test   the test suite under ThreadSanitizer
#   make bench       the microbenchmarks
#   make fuzz        every libFuzzer target for FUZZ_SECONDS (60) each, from seeds; a crash,
#                    hang or leak fails it (clang; docs/robustness.md)
#   make report      the benchmarks and kvd-eval with JSON output, then docs/results.md and its
#                    plots (matplotlib); GPU_JSON=path adds a scripts/gpu-check.sh result;
#                    LONGBENCH_JSON= and FIDELITY_JSON= take full kvd-longbench runs (default:
#                    short runs of it on SmolLM2, where the model is cached); REAL_TRACE=a
#                    kvd-llama --record-trace file adds index and cache tables on real attention
#                    COLD_CODEC_JSON= a scripts/bench-cold-codec.py --json file adds the
#                    cold-codec section
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
QUICK_BUILD ?= build-quick
FUZZ_SECONDS ?= 60
FUZZ_RUNS ?=
CMAKE ?= cmake
# Debian's python3 (where apt puts matplotlib), not one a version manager put first on PATH.
PYTHON ?= $(shell [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || echo python3)

.PHONY: all bootstrap configure build test quick-test asan-test tsan-test demo bench report fuzz clean

all: build

bootstrap:
	@bash scripts/bootstrap

configure: bootstrap
	$(CMAKE) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

build: configure
	$(CMAKE) --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Optimised at -O1 (faster to build than Release; assertions on), without the decoder, the
# benchmarks or nvcc: only the programs the quick tests need are built.
quick-test: bootstrap
	$(CMAKE) -S . -B $(QUICK_BUILD) -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1" -DKVD_CUDA=OFF \
	  -DKVD_BUILD_BENCH=OFF -DKVD_BUILD_EXAMPLES=OFF
	$(CMAKE) --build $(QUICK_BUILD) -j $(JOBS) --target quick_tests
	cd $(QUICK_BUILD) && ctest --output-on-failure -j $(JOBS) -L quick

asan-test: bootstrap
	$(CMAKE) -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVD_CUDA=OFF \
	  -DKVD_BUILD_BENCH=OFF -DKVD_BUILD_EXAMPLES=OFF \
	  -DCMAKE_CXX_FLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
	$(CMAKE) --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -E package_consumer

tsan-test: bootstrap
	$(CMAKE) -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVD_CUDA=OFF \
	  -DKVD_BUILD_BENCH=OFF -DKVD_BUILD_EXAMPLES=OFF \
	  -DCMAKE_CXX_FLAGS="-O1 -g -fsanitize=thread"
	$(CMAKE) --build $(TSAN_BUILD) -j $(JOBS)
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) -E package_consumer

# The main job: SmolLM2-135M-Instruct (scripts/get-model fetches it) reads a real ~4K-token
# document (the licence texts of /usr/share/common-licenses, one magic number inserted at a
# seeded depth) in tiered mode and answers the question about it. At 4K tokens its whole KV cache
# is about 94 MB (f16); the demo caps the fast tier (sink, local, staging and the lookahead cache)
# and the DRAM tier well below that, so the SSD store under the build folder serves reads.
DEMO_ARGS ?= --model smollm2 --needle 4000 --needle-depth 0.5 --needle-seed 1 --steps 24 \
             --mode tiered --budget 0.0625 --fast-bytes 20000000 --host-bytes 16777216 --ssd-path $(BUILD)/kvd-demo.store

demo: bootstrap
	bash scripts/get-model
	$(CMAKE) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	$(CMAKE) --build $(BUILD) -j $(JOBS) --target kvd-llama
	./$(BUILD)/examples/llama3/kvd-llama $(DEMO_ARGS)

bench: bootstrap
	$(CMAKE) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	$(CMAKE) --build $(BUILD) -j $(JOBS) --target bench_attention
	./$(BUILD)/bench/bench_attention

fuzz:
	@bash scripts/bootstrap --fuzz
	CC=clang CXX=clang++ $(CMAKE) -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVD_FUZZ=ON -DKVD_CUDA=OFF \
	  -DKVD_BUILD_TESTS=OFF -DKVD_BUILD_BENCH=OFF -DKVD_BUILD_EXAMPLES=OFF
	$(CMAKE) --build $(FUZZ_BUILD) -j $(JOBS)
	bash scripts/fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_RUNS)

report:
	@bash scripts/bootstrap --report
	$(CMAKE) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	$(CMAKE) --build $(BUILD) -j $(JOBS) --target kvd-eval bench_tier bench_pipeline kvd-llama kvd-longbench
	$(PYTHON) scripts/report.py --build $(BUILD) $(if $(GPU_JSON),--gpu-json $(GPU_JSON)) \
	  $(if $(LONGBENCH_JSON),--longbench-json $(LONGBENCH_JSON)) $(if $(FIDELITY_JSON),--fidelity-json $(FIDELITY_JSON)) \
	  $(if $(REAL_TRACE),--real-trace $(REAL_TRACE)) $(if $(COLD_CODEC_JSON),--cold-codec-json $(COLD_CODEC_JSON))

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
