# make diff | test | bench | lint. Set-up is automatic: where torch and tilelang already import (the
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

.PHONY: test diff bench lint setup clean
setup: $(SETUP)

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e '.[test,lint]'
	touch $@

test: $(SETUP)
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)

diff: $(SETUP)
	$(PYTHON) -m tilelang_ops diff

bench: $(SETUP)
	$(PYTHON) -m benchmarks $(BENCH_ARGS)

lint: $(SETUP)
	$(PYTHON) -m ruff check .

clean:
	rm -rf $(VENV) .cache .pytest_cache
