# make diff | test | bench | sanitize | lint. Set-up is automatic: where torch and tilelang already import (the
# GPU machine, which has no network) nothing is installed; elsewhere a virtual environment is made
# with the CPU build of torch==2.13.0 first, so no CUDA build is ever downloaded.
PY ?= python3
VENV := .venv
HAVE_DEPS := $(shell $(PY) -c "import torch, tilelang, pytest" >/dev/null 2>&1 && echo yes)
ifeq ($(HAVE_DEPS),yes)
PYTHON := $(PY)
SETUP :=
else
PYTHON := $(VENV)/bin/python
SETUP := $(VENV)/.installed
endif
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
export TILELANG_CACHE_DIR ?= $(CURDIR)/.cache/tilelang
PYTEST_ARGS ?=
# On a CUDA machine `make test` first compiles every kernel the GPU tests launch, in parallel processes,
# then runs pytest in TEST_WORKERS parallel workers (pytest-xdist, where installed): one per CPU, at most one
# per 10 GiB of GPU memory (the largest GPU tests hold several GiB each).
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os, torch; print(max(1, min(os.cpu_count(), \
	torch.cuda.get_device_properties(0).total_memory // (10 << 30))))" 2>/dev/null || echo 1)
HAVE_CUDA = $(shell $(PYTHON) -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null)
HAVE_XDIST = $(shell $(PYTHON) -c "import xdist" >/dev/null 2>&1 && echo yes)

.PHONY: test diff bench sanitize lint setup clean
setup: $(SETUP)

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e '.[test,lint]'
	touch $@

test: $(SETUP)
ifeq ($(HAVE_CUDA),1)
	$(PYTHON) -m tests.compile_ahead
	$(PYTHON) -m pytest -q $(if $(HAVE_XDIST),-n $(TEST_WORKERS)) $(PYTEST_ARGS)
else
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)
endif

diff: $(SETUP)
	$(PYTHON) -m tilelang_ops diff $(DIFF_ARGS)

bench: $(SETUP)
	$(PYTHON) -m benchmarks $(BENCH_ARGS)

# CUDA only: make diff under compute-sanitizer memcheck, racecheck / synccheck on one small case per kernel
sanitize: $(SETUP)
	PYTHON=$(PYTHON) bash tools/sanitize.sh

lint: $(SETUP)
	$(PYTHON) -m ruff check .

clean:
	rm -rf $(VENV) .cache .pytest_cache
