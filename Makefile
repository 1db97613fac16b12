# Thin wrapper over the CMake presets. Every target first makes sure the Debian packages are there.
JOBS ?= $(shell nproc)
KAREUS := build/release/bin/kareus
RUN_WORKLOAD ?= workloads/paper/llama3.2-3b_tp8_mbs8_seq4096.yaml

.PHONY: deps build test run bench debug-test format clean fuzz tidy

deps:
	@bash scripts/install-deps

build: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS) -- --no-print-directory

test: build
	@ctest --preset release -j $(JOBS)

run: build
	@mkdir -p out
	@$(KAREUS) optimize $(RUN_WORKLOAD) --out out/$(basename $(notdir $(RUN_WORKLOAD))) --db out/profiles.db

bench: build
	@build/release/bin/kareus_bench
	@build/release/bin/frontier_scaling --max-pp 8 --max-mbs 32
	@build/release/bin/search_efficiency --seeds 5

# DEBUG_CTEST_ARGS: extra ctest arguments, e.g. -LE 'slow|python' as in .ci/run.
DEBUG_CTEST_ARGS ?=

debug-test: deps
	@cmake --preset debug >/dev/null
	@cmake --build --preset debug -j $(JOBS) -- --no-print-directory
	@ctest --preset debug -j $(JOBS) $(DEBUG_CTEST_ARGS)

# libFuzzer targets of the input parsers (tests/fuzz), each run FUZZ_SECONDS under ASan/UBSan,
# starting from the committed inputs in tests/fuzz/<target>/. New inputs stay in the build
# folder; a crash stops with the input in $(FUZZ_DIR)/artifacts/ (add it to tests/fuzz/<target>/
# once fixed: the unit tests replay that folder).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= workload plan trace
FUZZ_DIR ?= build/fuzz

fuzz:
	@bash scripts/install-deps --dev-tools
	@cmake -S . -B $(FUZZ_DIR) -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14 \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKAREUS_FUZZ=ON -DKAREUS_BUILD_TESTS=OFF \
	  -DKAREUS_BUILD_BENCH=OFF -DKAREUS_WITH_CUDA=OFF >/dev/null
	@cmake --build $(FUZZ_DIR) -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS)) \
	  -- --no-print-directory
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_DIR)/corpus/$$t $(FUZZ_DIR)/artifacts && \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s" && \
	  $(FUZZ_DIR)/bin/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 \
	    -print_final_stats=1 -artifact_prefix=$(FUZZ_DIR)/artifacts/$$t- \
	    $(FUZZ_DIR)/corpus/$$t tests/fuzz/$$t || exit 1; \
	done

# clang-tidy over src/ and tools/ with the checks of .clang-tidy (warnings are errors), using the
# compile commands of the release configuration (TIDY_BUILD).
TIDY_BUILD ?= build/release

tidy:
	@bash scripts/install-deps --dev-tools
	@if [ "$(TIDY_BUILD)" = build/release ]; then cmake --preset release >/dev/null; \
	  else cmake -S . -B $(TIDY_BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null; fi
	@run-clang-tidy-14 -quiet -p $(TIDY_BUILD) -j $(JOBS) '$(CURDIR)/(src|tools)/.*\.cc$$'

format:
	@find include src tools tests bench -name '*.h' -o -name '*.cc' | xargs clang-format -i

clean:
	rm -rf build
