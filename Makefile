# make book: create .venv if needed, install, execute every notebook and build _build/html.
# make test: everything: unit and property tests, nbval over every notebook, the built book in a browser.
VENV ?= .venv
PY := $(VENV)/bin/python
SHARED ?= $(abspath ../shared/data)
# Real traces and measured timings: a local mirror when one sits beside the repository (CI, developers).
ifneq ($(wildcard $(SHARED)/traces),)
export BATCHLAB_DATA_DIR ?= $(SHARED)/traces
export BATCHLAB_MEASURED_DIR ?= $(SHARED)/measured
endif
export PYTHONHASHSEED := 0

.PHONY: book test unit nbval browser bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

book: $(VENV)/.installed
	$(VENV)/bin/jupyter-book build -W -n --keep-going .
	@echo "The book is in $(CURDIR)/_build/html/index.html"

unit: $(VENV)/.installed
	$(PY) -m pytest -q tests --ignore=tests/test_book_browser.py --ignore=tests/test_jupyterlab_live.py

nbval: $(VENV)/.installed
	$(PY) -m pytest -q --nbval-lax --nbval-current-env --nbval-cell-timeout=300 -p no:randomly notebooks

browser: book
	$(PY) -m pytest -q tests/test_book_browser.py tests/test_jupyterlab_live.py

test: unit nbval browser

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_simulate.py

clean:
	rm -rf _build
