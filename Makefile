# eagledata — `make test` and `make demo` set everything up themselves (idempotent, fast when unchanged).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup test demo lab bench clean
setup: $(STAMP)

# torch==2.13.0 is pinned in requirements.txt and installed in the same pip call as transformers,
# so pip takes the CPU build instead of a multi-GB CUDA one. ./kernel registers the `eagledata` kernel
# (the same route as environment.yml).
$(STAMP): requirements.txt pyproject.toml kernel/pyproject.toml kernel/share/jupyter/kernels/eagledata/kernel.json
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt -e . ./kernel
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) -m eagledata.demo --output-dir outputs

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=. $(if $(filter 0,$(shell id -u)),--allow-root)

# Quick figures; the long efficiency run (L = 300 s) and GPU presets are in bench/README.md.
bench: $(STAMP)
	$(PY) bench/tokenize_bench.py --chars 20000000
	$(PY) bench/emulator_bench.py
	$(PY) bench/generate_bench.py all --latency 10 --requests 8000
	$(PY) bench/hidden_states_bench.py --preset cpu-small --repeat 4

clean:
	rm -rf $(VENV) outputs/runs
