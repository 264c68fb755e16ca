# Two commands on a fresh clone:  `make run` (the main job) and `make test` (the tests).
# Both create or reuse the virtualenv in $(VENV) and install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU machines get the CPU build lying on disk (fast); a machine with an NVIDIA driver gets
# PyPI's default CUDA build. Override with `make TORCH=torch==X.Y.Z run`.
TORCH ?= $(shell if command -v nvidia-smi >/dev/null 2>&1; then echo torch; else echo torch==2.13.0; fi)
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean

# uv (from PyPI) installs in a fraction of pip's time. It does not read pip's configuration, so the
# find-links and extra indexes pip is set up with (the CPU torch wheel lies in one) are handed to it,
# all of them searched as pip does; where uv cannot be installed, pip does the same install.
PIP_CONFIG = $(shell python3 -m pip config get global.$(1) 2>/dev/null)
UV_INSTALL = $(VENV)/bin/uv pip install -q --python $(PY) --index-strategy unsafe-best-match \
	$(addprefix --find-links ,$(call PIP_CONFIG,find-links)) \
	$(addprefix --extra-index-url ,$(call PIP_CONFIG,extra-index-url))

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	if $(PY) -m pip install -q uv; then \
	  $(UV_INSTALL) "$(TORCH)" -e '.[dev]'; \
	else \
	  $(PY) -m pip install -q "$(TORCH)" && $(PY) -m pip install -q -e '.[dev]'; \
	fi
	touch $(STAMP)

install: $(STAMP)

# The main job (configs/helmet.yaml): niah_mk2 at 1K, 32 samples, arms dense / msa / msa-oracle, paired deltas
# and keys read; every other category: `msa-eval run helmet_all --backend local`.
run: $(STAMP)
	$(VENV)/bin/msa-eval run helmet --backend local

# ruff and mypy, configured in pyproject.toml; `make test` runs them first, so CI fails on a lint error
lint: $(STAMP)
	$(PY) -m ruff check
	$(PY) -m mypy --cache-dir $(VENV)/.mypy_cache

# one pytest-xdist worker per core; pyproject.toml's addopts keep each test file on one worker
test: $(STAMP) lint
	$(PY) -m pytest -q -x -p no:cacheprovider -n auto tests

clean:
	rm -rf $(VENV)
