# toolmesh — the two commands are `make up` and `make test`; everything else is a step of them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTOS := $(shell find protos -name '*.proto' | sort)

.PHONY: help install gen gen-check lint typecheck buf check test test-fast up bench clean

help:
	@echo "make up     - install, generate, migrate + seed the database, start the mesh"
	@echo "make test   - install, then gen-check, ruff, mypy, buf, and the whole pytest suite"
	@echo "make bench  - benchmarks (ratios against baselines measured in the same run)"
	@echo "make gen    - regenerate gen/ from protos/"

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

test: $(STAMP) check
	$(BIN)/pytest -q

# The suite without the PostgreSQL leg, for a quick local loop.
test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not postgres" -x

up: $(STAMP) gen
	$(BIN)/toolmesh up

bench: $(STAMP)
	$(PY) -m bench.dispatch_overhead
	$(PY) -m bench.guardrails_overhead

clean:
	rm -rf .toolmesh .pytest_cache .mypy_cache .ruff_cache
