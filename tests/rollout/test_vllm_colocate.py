"""The vLLM colocate backend against a real engine, on a tiny local Llama (float32, CPU).

vLLM is not in the trainer's venv: the checks (`colocate_cases.py`, each asserting what it checks) run in
one process of .venv-vllm, sharing one engine, and each test here reports its case. Needs `make vllm-env`
(CI builds it before the tests).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PYTHON = REPO / ".venv-vllm" / "bin" / "python"

_spec = importlib.util.spec_from_file_location("colocate_cases", HERE / "colocate_cases.py")
_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cases)  # only for the case names: reading the script needs no vLLM

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PYTHON.exists(), reason=f"no {PYTHON.parent.parent.name}: run `make vllm-env`"),
]


def _run_cases(folder: Path, model: str, *cases: str) -> dict[str, str]:
    """Case name -> "ok" or its traceback, from one run of `cases` (default: all) in .venv-vllm."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the backend's own CPU default is under test
    command = [str(PYTHON), str(HERE / "colocate_cases.py"), str(folder / "report.json"), model, *cases]
    run = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    if run.returncode != 0 or not (folder / "report.json").exists():
        pytest.fail(f"the colocate cases did not run (exit {run.returncode}):\n{run.stderr[-4000:]}")
    return json.loads((folder / "report.json").read_text())


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return _run_cases(tmp_path_factory.mktemp("colocate"), "llama")


@pytest.mark.parametrize("case", sorted(_cases.CASES))
def test_colocated_engine(report, case):
    assert report[case] == "ok", report[case]


def test_a_tied_output_layer_follows_a_sync(tmp_path):
    # the tiny Qwen2 ties lm_head to the embedding, as Qwen2.5 does: the engine reaches the tied layer
    # through the embedding only, and must still compute logits with the synced weights
    case = "engine_logprobs_equal_the_trainers_and_follow_a_weight_sync"
    report = _run_cases(tmp_path, "qwen2", case)
    assert report[case] == "ok", report[case]
