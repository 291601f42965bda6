# Two set-up commands: `make demo` (end-to-end demo on the embedded store) and `make test`.
# Everything runs in a virtual environment of its own (.venv), so a distribution's Python that
# refuses `pip install` into itself (PEP 668, "externally-managed-environment": Debian, Ubuntu)
# works as well as any other. It sees the base interpreter's packages (--system-site-packages),
# so what is already installed there is not downloaded again.
PYTHON3 ?= python3
VENV ?= .venv
PYTHON = $(VENV)/bin/python
PIP = $(PYTHON) -m pip install -q --disable-pip-version-check

.PHONY: install demo test lint bench neo4j-start neo4j-stop

$(PYTHON):
	@$(PYTHON3) -m venv --system-site-packages $(VENV) || { rm -rf $(VENV); \
	  echo "make: '$(PYTHON3) -m venv' failed; on Debian/Ubuntu install the venv module first:" \
	       "sudo apt-get install python3-venv" >&2; exit 1; }

install: $(PYTHON)
	$(PIP) -e '.[dev]'

demo: install
	rm -rf .etstore-demo etstore-demo
	$(VENV)/bin/etstore --store .etstore-demo demo --out etstore-demo

# The store contract suite runs against both backends: a local Neo4j 5 is started for the run
# (and stopped after it, pass or fail) when Java and Maven exist; otherwise those cases skip.
# The report test renders in headless Chromium, installed from Debian's packages when missing.
test: install
	$(PYTHON) -m ruff check etstore tests bench
	$(PYTHON) -m mypy
	bash scripts/ensure-chromium.sh
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" scripts/neo4j.sh with $(PYTHON) -m pytest

neo4j-start:
	@scripts/neo4j.sh start >/dev/null && echo "export ETSTORE_TEST_NEO4J=\$$(scripts/neo4j.sh url)"

neo4j-stop:
	scripts/neo4j.sh stop

bench: install
	for b in bench/bench_*.py; do $(PYTHON) $$b || exit 1; done
