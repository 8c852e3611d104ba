"""The colocate backend's refusals, all raised before an engine starts: they run without vLLM."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from rlhfkit.rollout import make_generation_backend
from rlhfkit.rollout.vllm_colocate import VLLMColocateBackend
from rlhfkit.testing import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def test_asking_for_the_colocate_backend_without_vllm_names_both_fixes(model, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails, as in the trainer's venv
    with pytest.raises(ImportError) as err:
        make_generation_backend(model, 1, engine="vllm-colocate")
    message = str(err.value)
    assert message.startswith("vllm_mode='colocate' needs vLLM")
    assert "`make vllm-env` builds .venv-vllm" in message and "vllm_mode='server'" in message


def test_an_untested_vllm_version_is_refused(model, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.11.0"))
    with pytest.raises(ImportError, match=r"vLLM 0.11.0 is not supported by vllm_mode='colocate'"):
        VLLMColocateBackend(model, 1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"enable_sleep_mode": True}, r"enable_sleep_mode needs a GPU: vLLM refuses sleep mode on CPU"),
        ({"tensor_parallel_size": 2}, r"tensor_parallel_size=2 is not supported on CPU.*vllm_mode='server'"),
        ({"gpu_memory_utilization": 0.0}, r"gpu_memory_utilization must be in \(0, 1\], got 0.0"),
        ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization must be in \(0, 1\], got 1.5"),
        ({"value_head": torch.nn.Linear(2, 1)}, r"returns no value-head outputs"),
    ],
)
def test_what_the_colocated_engine_cannot_do_on_cpu_is_refused_naming_the_argument(
    model, monkeypatch, kwargs, message
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "vllm", None)  # refused before vLLM is even looked for
    with pytest.raises(ValueError, match=message):
        VLLMColocateBackend(model, 1, **kwargs)
