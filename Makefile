# toolmesh — the two commands are `make up` and `make test`; everything else is a step of them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTOS := $(shell find protos -name '*.proto' | sort)

.PHONY: help install gen gen-check lint typecheck buf check test test-fast up sandbox-deps traces bench clean

help:
	@echo "make up     - install, generate, migrate + seed the database, start the mesh"
	@echo "make test   - install, then gen-check, ruff, mypy, buf, and the whole pytest suite"
	@echo "make bench  - benchmarks (ratios against baselines measured in the same run)"
	@echo "make gen    - regenerate gen/ from protos/"
	@echo "make traces - the mesh exporting to a local trace UI (Phoenix) on 127.0.0.1:6006"

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# Generated code: the proto root is the Python import root (gen/toolmesh/...).
define run_protoc
	rm -rf $(1) && mkdir -p $(1)
	$(PY) -m grpc_tools.protoc -I protos \
		--python_out=$(1) --grpc_python_out=$(1) --pyi_out=$(1) $(PROTOS)
endef

gen: $(STAMP)
	$(call run_protoc,gen)

# Fails when gen/ is not what `make gen` would produce from protos/.
gen-check: $(STAMP)
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	$(PY) -m grpc_tools.protoc -I protos --python_out=$$tmp --grpc_python_out=$$tmp --pyi_out=$$tmp $(PROTOS) && \
	if ! diff -r -q gen $$tmp >/dev/null; then \
		echo "gen/ is stale: run 'make gen' and commit the result"; diff -r -q gen $$tmp; exit 1; \
	else echo "gen/ is up to date"; fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# buf lint (STANDARD) and buf breaking against the previous commit that had protos.
buf: $(STAMP)
	cd protos && ../$(BIN)/buf lint
	@if git rev-parse -q --verify HEAD~1 >/dev/null && git cat-file -e HEAD~1:protos/buf.yaml 2>/dev/null; then \
		cd protos && ../$(BIN)/buf breaking --against '../.git#ref=HEAD~1,subdir=protos' && echo "buf breaking: ok"; \
	else echo "buf breaking: no earlier protos to compare against"; fi

check: gen-check lint typecheck buf

# The suite runs in TEST_WORKERS processes (pytest-xdist), each test file whole in one of them
# (its module-scoped meshes start once); each worker has its own PostgreSQL server and temp dirs.
# Files go out in collection order, the long integration files first: xdist's default order (most
# tests first) left the one-test, 45-second soak file to run alone at the end.
TEST_WORKERS ?= 2

test: $(STAMP) sandbox-deps check
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The suite without the PostgreSQL leg, for a quick local loop.
test-fast: $(STAMP)
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not postgres" -x

up: $(STAMP) sandbox-deps gen
	$(BIN)/toolmesh up

# A local trace UI (Arize Phoenix, installed from PyPI into .venv-phoenix, offline) with the
# mesh exporting to it: open http://127.0.0.1:6006.
traces: $(STAMP) gen
	deploy/local-traces.sh

bench: $(STAMP)
	$(PY) -m bench.dispatch_overhead
	$(PY) -m bench.call_stream
	$(PY) -m bench.guardrails_overhead
	$(PY) -m bench.sandbox_overhead
	$(PY) -m bench.tracing_overhead
	$(PY) -m bench.mcp_overhead
	$(PY) -m bench.surface_overhead

# The sandbox runs custom tools inside bubblewrap: install it quietly when missing (as root,
# non-interactive; elsewhere, say what to install).
sandbox-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
			{ apt-get update -qq >/dev/null 2>&1 && \
			  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1; }; \
		fi; \
		command -v bwrap >/dev/null 2>&1 || { echo "install bubblewrap (bwrap) for the sandbox"; exit 1; }; }

clean:
	rm -rf .toolmesh .pytest_cache .mypy_cache .ruff_cache
