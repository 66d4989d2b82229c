# make book: create .venv if needed, install, execute every notebook and build _build/html.
# make test: everything: lint, unit and property tests, nbval over every notebook, the built book in a browser.
VENV ?= .venv
PY := $(VENV)/bin/python
SHARED ?= $(abspath ../shared/data)
# Raw traces and measured timings: a local mirror when one sits beside the repository (CI, developers). Without
# it the book builds from the compact tables in data/, and the tests marked needs_data say what to set.
ifneq ($(wildcard $(SHARED)/traces),)
export BATCHLAB_DATA_DIR ?= $(SHARED)/traces
export BATCHLAB_MEASURED_DIR ?= $(SHARED)/measured
endif
export PYTHONHASHSEED := 0

.PHONY: book test lint unit nbval browser bench clean mutate

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

book: $(VENV)/.installed
	$(VENV)/bin/jupyter-book build -W -n --keep-going .
	@echo "The book is in $(CURDIR)/_build/html/index.html"

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

unit: $(VENV)/.installed
	$(PY) -m pytest -q -m "not browser and not live and not book" tests

nbval: $(VENV)/.installed
	$(PY) -m pytest -q --nbval-lax --nbval-current-env --nbval-cell-timeout=300 -p no:randomly notebooks

browser: book
	$(PY) -m pytest -q -m "browser or live or book" tests

test: lint unit nbval browser

# make mutate: mutation testing with mutmut (not in CI: slow), in a scratch copy (_build/mutate), kernels as plain
# Python (NUMBA_DISABLE_JIT=1, @njit removed from the mutated kernel files). Default scope: the metrics, the cost
# model and the kernel's cost formula against a fast hand-worked test subset (20-40 minutes on 2 cores);
# MUTATE_PATHS=batchlab mutates the whole package in two strata (kernels JIT off, the rest JIT on with the broad
# tests; hours unless sampled). MUTATE_SAMPLE=N scores a random sample of N mutants (95 % interval), MUTATE_SEED=S
# its seed (default 0), MUTATE_REV=REV mutates the tracked files of commit REV ("before" scores); empty = off.
# Scores and survivors: scripts/MUTANTS.md.
MUTATE_PATHS ?= batchlab/metrics.py batchlab/cost.py batchlab/_kernels/cost.py
MUTATE_SAMPLE ?=
MUTATE_SEED ?= 0
MUTATE_REV ?=
mutate: $(VENV)/.installed
	$(PY) scripts/mutate.py $(MUTATE_PATHS) $(if $(MUTATE_SAMPLE),--sample $(MUTATE_SAMPLE) --seed $(MUTATE_SEED)) $(if $(MUTATE_REV),--rev $(MUTATE_REV))

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_simulate.py

clean:
	rm -rf _build
