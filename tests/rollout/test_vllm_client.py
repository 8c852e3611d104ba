"""The vLLM server backend's checks that need no server: unreachable URL, another model, value heads."""

from __future__ import annotations

import socket
import time

import pytest
import torch
from safetensors.torch import load

from rlhfkit.rollout.vllm_client import VLLMServerBackend, _pieces, check_same_model
from rlhfkit.testing import tiny_model

LLAMA_INFO = {
    "model": "/srv/llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 1000,
    "hidden_size": 128,
    "num_hidden_layers": 2,
}


def _closed_port() -> int:
    with socket.socket() as s:  # bound then released: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_server_names_the_url_and_the_timeout():
    url = f"http://127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"no vLLM server answered at {url} within 1.5 s .*vllm-serve"):
        VLLMServerBackend(tiny_model("llama"), 1, base_url=url, timeout=1.5)
    assert 1.5 <= time.monotonic() - start < 10  # it kept trying for the whole timeout, then stopped


def test_the_same_model_passes():
    check_same_model(LLAMA_INFO, tiny_model("llama"), "http://srv")


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"vocab_size": 151936},
            r"\(vocab_size 151936\), but the trainer's model is .*llama \(vocab_size 1000\)",
        ),
        ({"num_hidden_layers": 24}, r"\(num_hidden_layers 24\), but .* \(num_hidden_layers 2\)"),
        ({"architectures": ["Qwen2ForCausalLM"]}, r"architectures \['Qwen2ForCausalLM'\].*LlamaForCausalLM"),
    ],
)
def test_another_model_on_the_server_is_refused_naming_both(change, message):
    with pytest.raises(ValueError, match=r"the vLLM server at http://srv serves /srv/llama .*" + message):
        check_same_model({**LLAMA_INFO, **change}, tiny_model("llama"), "http://srv")


def test_a_value_head_is_refused_before_any_request():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="returns no value-head outputs"):
        VLLMServerBackend(model, 1, base_url="http://127.0.0.1:1", value_head=model.lm_head)


def test_a_non_positive_timeout_is_refused():
    with pytest.raises(ValueError, match="timeout must be > 0 seconds, got 0"):
        VLLMServerBackend(tiny_model("llama"), 1, base_url="http://127.0.0.1:1", timeout=0)


def test_weights_travel_in_pieces_that_round_trip_and_a_big_tensor_goes_alone():
    weights = [("a", torch.zeros(10)), ("b", torch.ones(300)), ("c", torch.arange(5.0)), ("d", torch.ones(2))]
    pieces = [load(p) for p in _pieces(iter(weights), limit=100 * 4)]  # 100 float32 numbers a piece
    assert [sorted(p) for p in pieces] == [["a"], ["b"], ["c", "d"]]
    merged = {k: v for p in pieces for k, v in p.items()}
    assert all(torch.equal(merged[name], tensor) for name, tensor in weights)


def test_tied_weights_are_sent_as_separate_tensors():
    shared = torch.ones(4)
    (piece,) = _pieces(iter([("x", shared), ("y", shared.view(2, 2))]), limit=1 << 20)
    assert sorted(load(piece)) == ["x", "y"]  # safetensors refuses tensors sharing storage: copied apart
