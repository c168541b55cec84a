# numalign front door: `make demo` and `make test` install what is missing, build, and run.
SHELL := /bin/bash
BUILD ?= build
VENV ?= .venv
PY := $(VENV)/bin/python
APT_PACKAGES := build-essential cmake ninja-build libgtest-dev libsimdjson-dev libcli11-dev libhwy-dev libbenchmark-dev libxxhash-dev clang-format \
  clang-14 libclang-rt-14-dev chromium
.PHONY: deps deps-apt deps-python build install-python stubs wheel-check package-check demo test test-cpp \
  test-sanitize \
  test-python build-fuzz fuzz fuzz-smoke bench bench-smoke study study-smoke format format-check clean

deps: deps-apt deps-python

# Debian -dev packages; quiet and quick when everything is already there.
deps-apt:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# A local virtual environment with the Python test dependencies (torch pinned: CPU build).
deps-python: $(VENV)/.installed
$(VENV)/.installed: python/requirements-test.txt
	@[ -x $(PY) ] || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check -r python/requirements-test.txt 2>&1 \
	  | grep -v '^WARNING: Location' || true
	@touch $@

build: deps-apt
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j 2

# The Python package (nanobind module + CLI on the venv's PATH), built by scikit-build-core.
install-python: build deps-python
	@$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps . 2>&1 \
	  | grep -v '^WARNING: Location' || true
	@$(PY) -c "import numalign" || { echo "the numalign package failed to install"; exit 1; }

# The extension's type stubs, from the installed module (tests/python/test_stubs.py checks them).
stubs: install-python
	@$(PY) -m nanobind.stubgen -q -m numalign._core -p python/stubgen-patterns.txt -o python/numalign/_core.pyi

# The wheel carries every library it needs beyond the C/C++ runtime, and runs in a fresh venv.
wheel-check: deps-apt deps-python
	@bash tests/packaging/check_wheel.sh $(PY) $(BUILD)/wheel-check

# The C++ package as a downstream project uses it: installed into a temporary prefix, found by
# examples/cpp_kernel_test (find_package), by pkg-config and through add_subdirectory.
package-check: build
	@bash tests/packaging/check_cmake_package.sh $(BUILD)

demo: build install-python
	@$(BUILD)/make_example_traces $(BUILD)/demo
	@bash examples/demo.sh $(BUILD)/numalign $(BUILD)/demo
	@echo; echo "== The same rule from Python, on a torch module run forward and backward"
	@$(PY) examples/demo.py

test-cpp: build
	@cd $(BUILD) && ctest --output-on-failure -j 2

test-python: install-python
	@NUMALIGN_CLI=$(abspath $(BUILD))/numalign NUMALIGN_EXAMPLES=$(abspath $(BUILD))/make_example_traces \
	  $(PY) -m pytest -q tests/python

# The whole C++ suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
test-sanitize: deps-apt
	@cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNUMALIGN_BENCH=OFF \
	  "-DCMAKE_CXX_FLAGS=$(SAN_FLAGS)" >/dev/null
	@cmake --build build-asan -j 2
	@cd build-asan && ASAN_OPTIONS=abort_on_error=1 ctest --output-on-failure -j 2

# libFuzzer targets (clang): `make fuzz FUZZ_SECONDS=600` runs each; new inputs go to
# build-fuzz/corpus, never into the checked-in seeds under fuzz/corpus.
FUZZ_TARGETS := trace metadata rules report map
FUZZ_SECONDS ?= 60
build-fuzz: deps-apt
	@cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DNUMALIGN_FUZZ=ON \
	  -DNUMALIGN_BUILD_TESTS=OFF -DNUMALIGN_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  "-DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all" >/dev/null
	@cmake --build build-fuzz -j 2 --target $(addprefix fuzz_,$(FUZZ_TARGETS))

fuzz: build-fuzz
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus/$$t && cp -n fuzz/corpus/$$t/* build-fuzz/corpus/$$t/; \
	  echo "== fuzz_$$t for $(FUZZ_SECONDS) s"; \
	  build-fuzz/fuzz_$$t build-fuzz/corpus/$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=build-fuzz/ 2>&1 | grep -E 'stat::number_of_executed_units|ERROR|SUMMARY' || exit 1; \
	done

# In `make test`: replay every seed, then fuzz each target briefly.
fuzz-smoke: build-fuzz
	@for t in $(FUZZ_TARGETS); do \
	  build-fuzz/fuzz_$$t -runs=0 fuzz/corpus/$$t > build-fuzz/replay_$$t.log 2>&1 \
	    || { cat build-fuzz/replay_$$t.log; exit 1; }; \
	done
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=10

test: format-check test-cpp package-check test-sanitize fuzz-smoke test-python wheel-check bench-smoke \
  study-smoke

# The benchmark of docs/benchmarks.md: about 15 GB of traces under $(BUILD)/bench/data (and
# 0.5 GB of a million small tensors under $(BUILD)/bench/many_tensors),
# 6-20 minutes on 2 cores, depending on the machine. BENCH_ARGS="--scale 0.1" for a quicker look.
BENCH_ARGS ?= --dtypes bf16,fp16,fp32,fp8
bench: build install-python
	@$(PY) bench/bench.py --build $(BUILD) --out $(BUILD)/bench $(BENCH_ARGS)
	@echo "== what recording a run costs (bench/capture_bench.py)"
	@$(PY) bench/capture_bench.py
	@echo "== what isolate costs against three trace_model runs (bench/isolate_bench.py)"
	@$(PY) bench/isolate_bench.py
	@echo "== judging pieces of fused tensors through a map (bench/map_pieces.py)"
	@$(PY) bench/map_pieces.py --numalign $(BUILD)/numalign
	@echo "== a million small tensors against a simdjson parse of their headers (bench/many_tensors.py)"
	@$(PY) bench/many_tensors.py --build $(BUILD) --out $(BUILD)/bench/many_tensors

# In `make test`: the whole benchmark at a thousandth of its size, so that it keeps working
# (pipefail: a bench that fails fails it; grep reads each table to its end, no closed pipe).
bench-smoke: build install-python
	@$(PY) bench/bench.py --build $(BUILD) --out $(BUILD)/bench-smoke --scale 0.001 --repeat 1 \
	  --dtypes bf16,fp8 >/dev/null
	@grep -q '| model | bf16 |' $(BUILD)/bench-smoke/results.md
	@set -o pipefail; $(PY) bench/capture_bench.py --layers 1 --hidden 64 --vocab 97 --tokens 16 --repeat 1 \
	  | grep '| save_to |' >/dev/null
	@set -o pipefail; $(PY) bench/isolate_bench.py --layers 2 --hidden 64 --vocab 97 --tokens 16 --repeat 1 \
	  | grep '| isolate |' >/dev/null
	@set -o pipefail; $(PY) bench/map_pieces.py --numalign $(BUILD)/numalign --rows 64 --width 32 --repeat 1 \
	  | grep '| transposed |' >/dev/null
	@set -o pipefail; $(PY) bench/many_tensors.py --build $(BUILD) --out $(BUILD)/bench-smoke/many_tensors --count 2000 \
	  --repeat 1 | grep '| html |' >/dev/null

# The rule study (docs/rule_study.md, docs/rule_study.svg): false alarms and detection of every
# rule on a labelled corpus of correct and buggy kernels (study/); about 35 s on 2 cores.
study: install-python
	@$(PY) study/study.py

# In `make test`: the study at its small size, written under $(BUILD), so that it keeps working.
study-smoke: install-python
	@$(PY) study/study.py --small --out $(BUILD)/study-smoke >/dev/null 2>&1 \
	  || { $(PY) study/study.py --small --out $(BUILD)/study-smoke; exit 1; }
	@grep -q '| assert_close defaults |' $(BUILD)/study-smoke/rule_study.md

format:
	@clang-format -i $$(git ls-files '*.cpp' '*.hpp')

# In `make test`: every C++ file as .clang-format lays it out (`make format` fixes it).
format-check: deps-apt
	@clang-format --dry-run -Werror $$(git ls-files '*.cpp' '*.hpp')

clean:
	rm -rf $(BUILD) build-asan build-fuzz
