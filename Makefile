# The two commands of the README, and the steps they are made of.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv bytecode services services-down status unit layers bench clean

# uv installs what pip would, several times faster (a fresh clone's set-up, and the wheel test's venv). Unlike pip, it
# leaves the packages without their bytecode unless asked; and where PYTHONDONTWRITEBYTECODE is set (CI here), no
# import writes it either, so every process compiled every module it imported, at each start (streamlit, pandas and
# plotly: 2.6 s of CPU to import, 0.8 s compiled once).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

## the project's own modules compiled ahead, for the same reason (only those changed since are compiled again)
bytecode: venv
	$(PY) -m compileall -q -j 0 oncewatch checks collectors core dashboards shop store devservices app.py

services: bytecode
	$(PY) -m devservices.stack up

services-down:
	$(PY) -m devservices.stack down

status:
	$(PY) -m devservices.stack status

## the pipeline's layers (pyproject.toml [tool.importlinter]); tests/unit/test_layers.py also breaks them on purpose
layers: bytecode
	$(VENV)/bin/lint-imports --no-cache

## make test: everything the tests need, then the whole suite (the unit tests beside the integration tests:
## devservices/suite.py).
test: layers services
	$(PY) -m devservices.suite

## unit tests only (no servers, no promtool)
unit: layers
	$(PY) -m pytest -m "not integration"

## make demo: services, a workload, the monitor.
demo: services
	$(PY) -m devservices.demo

bench: services
	$(PY) bench/binlog_ingest.py

clean:
	rm -rf $(VENV) .pytest_cache
