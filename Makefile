# Thin wrapper over the CMake presets. Every target first makes sure the Debian packages are there.
JOBS ?= $(shell nproc)
KAREUS := build/release/bin/kareus
RUN_WORKLOAD ?= workloads/paper/llama3.2-3b_tp8_mbs8_seq4096.yaml

.PHONY: deps build test run bench debug-test format clean

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

debug-test: deps
	@cmake --preset debug >/dev/null
	@cmake --build --preset debug -j $(JOBS) -- --no-print-directory
	@ctest --preset debug -j $(JOBS)

format:
	@find include src tools tests bench -name '*.h' -o -name '*.cc' | xargs clang-format -i

clean:
	rm -rf build
