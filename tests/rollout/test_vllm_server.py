"""The vLLM server backend against a real engine: `rlhfkit vllm-serve` in .venv-vllm on a tiny local model.

One server (float32, eager) is started for the module through the command itself; the trainer's model is
the same tiny Llama loaded here. Needs `make vllm-env` (CI builds it before the tests).
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import pytest
import torch
from engine_checks import (
    REGEX,
    assert_a_batch_past_the_step_budget_is_sampled,
    assert_completions_match_the_regex,
    assert_engine_matches,
    assert_processed_logprobs_reported,
    assert_seeded_and_varied,
    assert_stops_and_padding,
    engine_prompts,
    logprob_gap,
)
from peft import LoraConfig, get_peft_model

from rlhfkit.rollout import SamplingParams, vllm_client
from rlhfkit.rollout.vllm_client import VLLMServerBackend, VLLMServerError, _call
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.testing.sharding import StandInZero3
from rlhfkit.testing.vllm_server import vllm_server

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / ".venv-vllm" / "bin" / "rlhfkit"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SERVER.exists(), reason=f"no {SERVER.parent.parent.name}: run `make vllm-env`"),
]


@contextlib.contextmanager
def _server(folder: Path, name: str):
    """The base URL of `rlhfkit vllm-serve` running tiny model `name`, saved into `folder`."""
    tiny_model(name).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    with vllm_server(SERVER, folder, folder.parent / f"server-{name}.log") as url:
        yield url


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL, model folder) of a server running `rlhfkit vllm-serve` on a saved tiny Llama."""
    folder = tmp_path_factory.mktemp("served") / "llama"
    with _server(folder, "llama") as url:
        yield url, folder


def test_completions_are_right_padded_and_end_at_the_first_stop_token(served):
    url, folder = served
    model, pad_id = tiny_model("llama"), 1
    backend = VLLMServerBackend(model, pad_id, base_url=url, timeout=5)
    assert_stops_and_padding(backend, pad_id)


def test_a_seeded_call_samples_the_same_again_and_repeated_prompts_differ(served):
    backend = VLLMServerBackend(tiny_model("llama"), 1, base_url=served[0], timeout=5)
    assert_seeded_and_varied(backend, 1)


def test_engine_logprobs_equal_the_trainers_and_follow_a_weight_sync(served, monkeypatch):
    monkeypatch.setattr(vllm_client, "WEIGHT_PIECE_BYTES", 64 * 2**10)  # a dozen pieces, one reload
    model = tiny_model("llama")
    backend = VLLMServerBackend(model, 1, base_url=served[0], timeout=5)
    assert_engine_matches(backend, model, 1)

    with torch.no_grad():  # an optimizer step, as far as the engine can tell
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    assert logprob_gap(backend, model, 1) > 1e-2  # the engine still has the old weights

    backend.sync_weights()
    assert_engine_matches(backend, model, 1)
    backend.sync_weights(tiny_model("llama"))  # the other tests expect the saved weights
    assert_engine_matches(backend, tiny_model("llama"), 1)


def test_the_output_says_when_its_logprobs_are_of_a_processed_distribution(served):
    model = tiny_model("llama")
    assert_processed_logprobs_reported(VLLMServerBackend(model, 1, base_url=served[0], timeout=5), model, 1)


def test_a_batch_past_the_engines_step_budget_is_sampled(served):
    assert_a_batch_past_the_step_budget_is_sampled(
        VLLMServerBackend(tiny_model("llama"), 1, base_url=served[0], timeout=60), 1
    )


def test_every_completion_matches_the_structured_outputs_regex(served):
    backend = VLLMServerBackend(
        tiny_model("llama"), 1, base_url=served[0], timeout=5, structured_outputs_regex=REGEX
    )
    assert_completions_match_the_regex(backend, tiny_tokenizer(), 1)


def test_a_regex_the_engine_cannot_compile_is_refused_naming_it(served):
    backend = VLLMServerBackend(tiny_model("llama"), 1, base_url=served[0], timeout=5)
    backend.structured_outputs_regex = "(unclosed"
    query_ids, query_mask = engine_prompts(1)
    with pytest.raises(VLLMServerError, match=r"refused .*generate.* \(400\)"):
        backend.generate(query_ids, query_mask, SamplingParams(max_new_tokens=4, top_k=0))
    backend.structured_outputs_regex = None
    assert_engine_matches(backend, tiny_model("llama"), 1)  # the server still serves


def test_a_zero3_policy_is_synced_one_module_at_a_time(served, monkeypatch):
    monkeypatch.setattr(vllm_client, "WEIGHT_PIECE_BYTES", 64 * 2**10)  # the budget of one gather, too
    torch.manual_seed(1)
    model = tiny_model("llama")
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    sharded = copy.deepcopy(model)
    zero3 = StandInZero3(sharded)
    backend = VLLMServerBackend(model, 1, base_url=served[0], timeout=5, gather_module=zero3.gather)
    backend.sync_weights(sharded)
    assert_engine_matches(backend, model, 1)  # every weight arrived whole
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    assert zero3.calls > model.config.num_hidden_layers and zero3.peak < total / 2 and zero3.live == 0
    backend.gather_module = None
    backend.sync_weights(tiny_model("llama"))  # the other tests expect the saved weights


def test_a_zero3_lora_policy_is_synced_merged_one_module_at_a_time(served, monkeypatch):
    monkeypatch.setattr(vllm_client, "WEIGHT_PIECE_BYTES", 64 * 2**10)  # the budget of one gather, too
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(tiny_model("llama"), config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(torch.randn_like(param) * 0.2)
    sharded = copy.deepcopy(model)
    zero3 = StandInZero3(sharded)
    backend = VLLMServerBackend(model, 1, base_url=served[0], timeout=5, gather_module=zero3.gather)
    backend.sync_weights(sharded)
    assert_engine_matches(backend, model, 1)  # every weight arrived whole, the adapters merged
    with model.disable_adapter():
        assert logprob_gap(backend, model, 1) > 1e-2
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    assert zero3.peak < total / 2 and zero3.live == 0
    backend.gather_module = None
    backend.sync_weights(tiny_model("llama"))  # the other tests expect the saved weights


def test_a_lora_policy_is_synced_merged(served):
    model = get_peft_model(
        tiny_model("llama"), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(torch.randn_like(param) * 0.2)
    backend = VLLMServerBackend(model, 1, base_url=served[0], timeout=5)
    backend.sync_weights()
    assert_engine_matches(backend, model, 1)
    backend.sync_weights(tiny_model("llama"))


def test_a_server_serving_another_model_is_refused_before_sampling(served):
    other = tiny_model("qwen2")
    with pytest.raises(
        ValueError, match=r"serves .*llama.*LlamaForCausalLM.*trainer's model is .*Qwen2ForCausalLM"
    ):
        VLLMServerBackend(other, 1, base_url=served[0], timeout=5)


@pytest.mark.parametrize(
    "tensor, problem",
    [
        (
            {"model.no_such_layer.weight": torch.zeros(2, 2)},
            "model.no_such_layer.weight .not in the checkpoint",
        ),
        (
            {"model.norm.weight": torch.zeros(3)},
            r"model.norm.weight .shape \[3\], the checkpoint's is \[128\]",
        ),
    ],
)
def test_weights_the_model_does_not_have_are_refused_before_the_engine_sees_them(served, tensor, problem):
    from safetensors.torch import save

    backend = VLLMServerBackend(tiny_model("llama"), 1, base_url=served[0], timeout=5)
    with pytest.raises(VLLMServerError, match=f"could not load the weights, the model has no {problem}"):
        _call(f"{backend.base_url}/update_weights/?last=true", body=save(tensor))
    assert_engine_matches(backend, tiny_model("llama"), 1)  # still serving, with its weights


def test_logprobs_at_another_temperature_than_the_sampling_one_are_refused(served):
    backend = VLLMServerBackend(tiny_model("llama"), 1, base_url=served[0], timeout=5)
    query_ids, query_mask = engine_prompts(1)
    params = SamplingParams(max_new_tokens=4, temperature=0.7)
    with pytest.raises(ValueError, match=r"sampling temperature \(0.7\), not at logprob_temperature=1"):
        backend.generate(query_ids, query_mask, params, logprob_temperature=1.0)


def test_a_tied_output_layer_follows_a_sync(tmp_path):
    # the tiny Qwen2 ties lm_head to the embedding, as Qwen2.5 does: the engine reaches the tied layer
    # through the embedding only, and must still compute logits with the synced weights
    model = tiny_model("qwen2")
    with _server(tmp_path / "qwen2", "qwen2") as url:
        backend = VLLMServerBackend(model, 1, base_url=url, timeout=5)
        with torch.no_grad():
            model.get_input_embeddings().weight.add_(torch.randn_like(model.get_input_embeddings().weight))
        backend.sync_weights()
        assert_engine_matches(backend, model, 1)
