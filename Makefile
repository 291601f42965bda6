# Two set-up commands: `make demo` (end-to-end demo on the embedded store) and `make test`.
PYTHON ?= python3
PIP = $(PYTHON) -m pip install -q --disable-pip-version-check

.PHONY: install demo test lint bench

install:
	$(PIP) -e '.[dev]'

demo: install
	rm -rf .etstore-demo etstore-demo
	etstore --store .etstore-demo demo --out etstore-demo

test: install
	$(PYTHON) -m ruff check etstore tests bench
	$(PYTHON) -m pytest

bench: install
	for b in bench/bench_*.py; do $(PYTHON) $$b || exit 1; done
