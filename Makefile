# Two commands set everything up on a fresh machine:
#   make demo   creates .venv and runs the ResNet-18 before/after case study on synthetic data
#   make test   creates .venv and runs lint + the test suite (what .ci/run calls)
#   make gpu-check  on a machine with one NVIDIA GPU: one pass/fail table of what the GPU side promises
#                   (under 5 minutes; also written to $$OUT/gpu_check.txt and .json when OUT is set)
VENV ?= .venv
PYTHON ?= python3
BIN = $(VENV)/bin
# torch first: pinned versions this project is tested with (any torch>=2.2 works for users)
TORCH = torch==2.14.1 torchvision==0.29.1

.PHONY: venv demo gpu-check test lint bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/python examples/resnet18_cifar10.py

gpu-check: venv
	$(BIN)/python benchmarks/gpu_check.py

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest

bench: venv
	$(BIN)/python benchmarks/bench_timing_accuracy.py
	$(BIN)/python benchmarks/bench_overhead.py
	$(BIN)/python benchmarks/bench_traces.py

clean:
	rm -rf $(VENV) perf_logs lightning_logs .pytest_cache
