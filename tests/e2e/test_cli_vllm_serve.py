"""`rlhfkit vllm-serve`'s flags and the errors it gives before starting an engine (the server itself:
tests/rollout/test_vllm_server.py)."""

from __future__ import annotations

import re
import sys
import types

import pytest

from rlhfkit.commands.vllm_serve import main
from rlhfkit.rollout.vllm_server import require_vllm


@pytest.mark.parametrize(
    "flags, message",
    [
        ([], "--model is required"),
        (["--model", "m", "--data_parallel_size", "2"], "--data_parallel_size 2 is not supported yet"),
        (
            ["--model", "m", "--gpu_memory_utilization", "1.5"],
            r"--gpu_memory_utilization must be in \(0, 1\]",
        ),
        (["--model", "m", "--log_level", "loud"], "--log_level must be one of critical"),
        (
            ["--model", "m", "--vllm_model_impl", "sglang"],
            "--vllm_model_impl must be 'vllm' or 'transformers'",
        ),
        (
            ["--model", "m", "--speculative_config", "{method: ngram}"],
            "--speculative_config must be a JSON object",
        ),
        (["--model", "m", "--speculative_config", "[1]"], "--speculative_config must be a JSON object, got"),
    ],
)
def test_bad_flags_are_one_line_errors(flags, message, capsys):
    assert main(flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlhfkit vllm-serve: error: ")
    assert re.search(message, err)


def test_without_vllm_the_error_says_how_to_get_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails, as in the trainer's venv
    assert main(["--model", "m"]) == 2
    err = capsys.readouterr().err
    assert "rlhfkit vllm-serve needs vLLM" in err and "`make vllm-env` builds .venv-vllm" in err


def test_an_untested_vllm_version_is_refused_at_start(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.10.2"))
    with pytest.raises(
        ImportError, match=r"vLLM 0.10.2 is not supported by rlhfkit vllm-serve \(tested: 0.32.x\)"
    ):
        require_vllm()
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.32.1"))
    assert require_vllm() == "0.32.1"
