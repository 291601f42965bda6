# Two set-up commands: `make demo` (end-to-end demo on the embedded store) and `make test`.
PYTHON ?= python3
PIP = $(PYTHON) -m pip install -q --disable-pip-version-check

.PHONY: install demo test lint bench neo4j-start neo4j-stop

install:
	$(PIP) -e '.[dev]'

demo: install
	rm -rf .etstore-demo etstore-demo
	etstore --store .etstore-demo demo --out etstore-demo

# The store contract suite runs against both backends: a local Neo4j 5 is started for the run
# (and stopped after it, pass or fail) when Java and Maven exist; otherwise those cases skip.
# The report test renders in headless Chromium, installed from Debian's packages when missing.
test: install
	$(PYTHON) -m ruff check etstore tests bench
	$(PYTHON) -m mypy
	bash scripts/ensure-chromium.sh
	scripts/neo4j.sh with $(PYTHON) -m pytest

neo4j-start:
	@scripts/neo4j.sh start >/dev/null && echo "export ETSTORE_TEST_NEO4J=\$$(scripts/neo4j.sh url)"

neo4j-stop:
	scripts/neo4j.sh stop

bench: install
	for b in bench/bench_*.py; do $(PYTHON) $$b || exit 1; done
