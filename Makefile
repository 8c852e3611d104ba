# Two entry points, both self-installing into .venv (idempotent):
#   make demo   set up and run the main job
#   make test   set up and run lint + the whole test suite
# and `make results`: re-render the measured figures in README.md and docs/ from the committed result
# files (results/*.json, benchmarks/*.json); re-measuring is scripts/record_demo_result.py (the demo)
# or the benchmark script named in each file's "command".
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS := dev,diffusion,tracking,demo,quant

.PHONY: setup demo test test-fast lint results clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rlhfkit demo $(ARGS)

results:
	$(PYTHON) scripts/render_results.py

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
