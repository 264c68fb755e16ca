# Two commands on a fresh clone:  `make run` (the main job) and `make test` (the tests).
# Both create or reuse the virtualenv in $(VENV) and install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU machines get the CPU build lying on disk (fast); a machine with an NVIDIA driver gets
# PyPI's default CUDA build. Override with `make TORCH=torch==X.Y.Z run`.
TORCH ?= $(shell if command -v nvidia-smi >/dev/null 2>&1; then echo torch; else echo torch==2.13.0; fi)
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/msa-eval run helmet --backend local

# ruff and mypy, configured in pyproject.toml; `make test` runs them first, so CI fails on a lint error
lint: $(STAMP)
	$(PY) -m ruff check
	$(PY) -m mypy --cache-dir $(VENV)/.mypy_cache

test: $(STAMP) lint
	$(PY) -m pytest -q -x -p no:cacheprovider tests

clean:
	rm -rf $(VENV)
