# Two commands set everything up on a fresh machine:
#   make demo   creates .venv and runs `lightning-perf tune` on the ResNet-18 example config (synthetic data)
#   make test   creates .venv and runs lint + the test suite (what .ci/run calls)
#   make lint   ruff, mypy (its baseline in pyproject.toml) and vulture; make test-fast: the pure stages' tests
#   make docs   builds the documentation site (mkdocs.yml, docs/) into site/, failing on any warning
#   make gpu-check  on a machine with one NVIDIA GPU: one pass/fail table of what the GPU side promises
#                   (under 5 minutes; also written to $$OUT/gpu_check.txt and .json when OUT is set)
VENV ?= .venv
PYTHON ?= python3
BIN = $(VENV)/bin
# torch first: pinned versions this project is tested with (any torch>=2.2 works for users; torchvision is
# the `examples` extra, pinned here to the build that matches this torch)
TORCH = torch==2.14.1 torchvision==0.29.1
# the Lightning the suite runs on first; both namespaces (`lightning`, `pytorch_lightning`) at the same version
LIGHTNING ?= 2.6.6
# the other Lightning versions of the declared range (pyproject's `lightning>=2.4,<3`) that .ci/run tests
LIGHTNING_MATRIX ?= 2.5.6 2.4.0

.PHONY: venv demo docs gpu-check test test-fast test-lightning test-integrations print-lightning print-lightning-matrix lint bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[dev,examples,loggers,docs,hydra]" lightning==$(LIGHTNING) pytorch-lightning==$(LIGHTNING)
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/pip install --quiet -e ".[examples]"
	$(BIN)/python examples/resnet18_cifar10.py

docs: venv
	$(BIN)/mkdocs build --strict -d site

gpu-check: venv
	$(BIN)/python benchmarks/gpu_check.py

# mypy reads its settings and its baseline of modules not checked yet from pyproject.toml ([tool.mypy]); vulture
# reports code nothing uses, less the names frameworks read (vulture_whitelist.py)
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/vulture lightning_perf vulture_whitelist.py --min-confidence 80

# PYTHONFAULTHANDLER: a test process (or a rank it spawns) that dies of a signal prints every thread's stack.
# PYTEST_JOBS: the suite in that many worker processes (pytest-xdist): one a core, at most 4 (most tests are one
# Python thread running a tiny fit; the suite took 16.4 min in one process on 2 cores, 11.0 min in two)
PYTEST_JOBS ?= -n auto --maxprocesses 4
test: lint
	PYTHONFAULTHANDLER=1 $(BIN)/python -m pytest $(PYTEST_JOBS)

# the pure stages, the trace reader and the import architecture: no Trainer, no subprocess of a fit (the loop
# while editing lightning_perf/analysis or lightning_perf/traces; `make test` runs them too)
FAST_TESTS = tests/analysis tests/traces tests/test_architecture.py
test-fast: venv
	PYTHONFAULTHANDLER=1 $(BIN)/python -m pytest -q $(PYTEST_JOBS) $(FAST_TESTS)

# the libraries that drive Lightning for their users (darts, pytorch-forecasting, neuralforecast, lightly), in a
# venv of their own: they cap pandas below 3 and scipy below 1.16, which the main venv's packages have moved past.
# ~3 min to install and ~6 min to run on 2 cores, so not in .ci/run (where tests/integrations skips them by name)
INTEGRATIONS_VENV ?= .venv-integrations
test-integrations:
	$(MAKE) venv VENV=$(INTEGRATIONS_VENV)
	$(INTEGRATIONS_VENV)/bin/pip install --quiet -e ".[integrations]" lightning==$(LIGHTNING) pytorch-lightning==$(LIGHTNING)
	PYTHONFAULTHANDLER=1 $(INTEGRATIONS_VENV)/bin/python -m pytest $(PYTEST_JOBS) tests/integrations

# the suite again on another Lightning in the same venv (swapping takes ~5 s): make test-lightning V=2.5.6.
# Only `make test` runs what cannot change with Lightning's version: the pure stages (analysis, traces, the
# import architecture), the readers of finished runs (the compare command, the Perf tab), our own files under disk
# faults, the docs and the GPU check's dry run, and the long tests marked `once` (timed trial/tune rounds, a
# Ctrl-C): ~4 minutes a version
ONLY_ONCE = --ignore=tests/analysis --ignore=tests/traces --ignore=tests/test_architecture.py \
	--ignore=tests/cli --ignore=tests/tensorboard_plugin --ignore=tests/faults/test_disk_faults.py \
	--ignore=tests/test_docs.py --ignore=tests/test_gpu_check.py -m "not once"
test-lightning: venv
	$(BIN)/pip install --quiet --no-deps lightning==$(V) pytorch-lightning==$(V)
	PYTHONFAULTHANDLER=1 $(BIN)/python -m pytest -q $(PYTEST_JOBS) $(ONLY_ONCE)
	$(BIN)/pip install --quiet --no-deps lightning==$(LIGHTNING) pytorch-lightning==$(LIGHTNING)

print-lightning:
	@echo $(LIGHTNING)

print-lightning-matrix:
	@echo $(LIGHTNING_MATRIX)

bench: venv
	$(BIN)/python benchmarks/bench_timing_accuracy.py
	$(BIN)/python benchmarks/bench_overhead.py
	$(BIN)/python benchmarks/bench_fetch_cpu.py
	$(BIN)/python benchmarks/bench_traces.py
	$(BIN)/python benchmarks/bench_handoff.py
	$(BIN)/python benchmarks/bench_hook_profiler.py

clean:
	rm -rf $(VENV) perf_logs lightning_logs .pytest_cache site
