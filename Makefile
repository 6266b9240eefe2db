# mqk — the two commands a newcomer needs: `make run` (a broker on 127.0.0.1:9092) and `make test`.
# Every target does its own set-up on a fresh machine: virtualenv, pip install (builds the Cython kernels),
# npm packages for the JS compat clients, and kcat, etcd, chromium and chromium-driver from Debian's packages.

PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-stamp
JSDIR   = compat/js
# the npm packages the JS compat clients require, installed beside the virtualenv's Python packages rather than in
# the source tree (compat/compat_helpers.py hands this folder to node as NODE_PATH)
JSDEPS  = $(VENV)/node
PYTEST_ARGS ?=

.PHONY: run test unit test-twins compat-deps setup bytecode gen gen-check lint bench clean

$(STAMP): pyproject.toml setup.py setup.cfg $(wildcard mqk/_fast/*.pyx mqk/_fast/*.pxd)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

setup: bytecode

# The package's bytecode, compiled ahead: where PYTHONDONTWRITEBYTECODE is set (container images often set it) Python
# would otherwise compile every module again at every start, the generated Kafka codecs too: each broker process
# (`mqk serve`, and the ones the test suite starts) would pay several hundred ms for it. compileall skips what is
# current, so this is cheap to repeat after an edit.
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 mqk >/dev/null

run: bytecode
	$(VENV)/bin/mqk serve

$(JSDEPS)/node_modules/.stamp: $(JSDIR)/package.json | $(STAMP)
	mkdir -p $(JSDEPS)
	cp $(JSDIR)/package.json $(JSDEPS)/package.json
	cd $(JSDEPS) && npm install --no-audit --no-fund --loglevel=error
	touch $@

compat-deps: $(JSDEPS)/node_modules/.stamp
	@command -v kcat >/dev/null 2>&1 || { \
	  echo "installing kcat (Debian package)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq kcat >/dev/null; }
	@{ command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || { \
	  echo "installing chromium and chromium-driver (Debian packages, for the web console's browser tests)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; }
	@command -v etcd >/dev/null 2>&1 || { \
	  echo "installing etcd (Debian package etcd-server, for the cluster-mode tests)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq etcd-server >/dev/null; }

# The gates (make lint), then the whole suite (unit, scenario, integration, compat with real clients) with its line
# coverage per package, then the unit and scenario tests once more on the pure-Python twins. Both runs use two
# pytest-xdist workers: most of the suite's time is tests waiting on brokers, clients and etcd. The tests that run
# clusters go to one worker, one at a time (tests/helpers.py: CLUSTER_TESTS). Coverage measures pytest and its
# workers from their start (COVERAGE_PROCESS_START; each worker's data file is combined afterwards), not the brokers
# the tests start.
XDIST = -n 2 --dist loadgroup
test: lint compat-deps bytecode
	rm -f .coverage .coverage.*
	COVERAGE_PROCESS_START=$(CURDIR)/pyproject.toml $(PY) -m pytest -q -p no:cacheprovider $(XDIST) --durations=15 $(PYTEST_ARGS)
	$(PY) -m coverage combine -q
	$(PY) tools/coverage_summary.py
	MQK_NO_EXTENSIONS=1 $(PY) -m pytest -q -p no:cacheprovider $(XDIST) tests/unit tests/scenario

unit: bytecode
	$(PY) -m pytest -q tests/unit

test-twins: bytecode
	MQK_NO_EXTENSIONS=1 $(PY) -m pytest -q tests/unit tests/scenario

# The Kafka codecs (mqk/protocol/kafka/messages/) from the spec files of the one kafka-python release that
# pyproject.toml's `gen` extra pins (`.[dev]` includes it); the generator refuses any other version.
gen: $(STAMP)
	$(PY) tools/gen_kafka_messages.py

gen-check: $(STAMP)
	$(PY) tools/gen_kafka_messages.py --check

# What CI holds every change to, before any test: lint rules, formatting, the generated codecs being current, types,
# and the import graph (the layers in pyproject.toml, data flowing down only, no cycles).
LINT_PATHS = mqk tests compat bench tools fuzz setup.py

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(PY) tools/gen_kafka_messages.py --check
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo pyproject.toml
	$(PY) tools/import_cycles.py

bench: bytecode
	$(PY) bench/store_bench.py

clean:
	rm -rf build *.egg-info mqk/_fast/*.so mqk/_fast/*.c
