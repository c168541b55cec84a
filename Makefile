# numalign front door: `make demo` and `make test` install what is missing, build, and run.
SHELL := /bin/bash
BUILD ?= build
VENV ?= .venv
PY := $(VENV)/bin/python
APT_PACKAGES := build-essential cmake ninja-build libgtest-dev libsimdjson-dev libcli11-dev clang-format
.PHONY: deps deps-apt deps-python build install-python demo test test-cpp test-python format clean

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

test: test-cpp test-python

format:
	@clang-format -i $$(git ls-files '*.cpp' '*.hpp')

clean:
	rm -rf $(BUILD)
