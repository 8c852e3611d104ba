"""Every tiny model loads with plain transformers Auto classes and produces well-shaped outputs."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from rlhfkit.testing import TINY_MODEL_NAMES, tiny_model, tiny_model_path, tiny_value_head_model

AUTO_CLASS = {
    "gpt2": AutoModelForCausalLM,
    "llama": AutoModelForCausalLM,
    "qwen2": AutoModelForCausalLM,
    "llama-small": AutoModelForCausalLM,
    "t5": AutoModelForSeq2SeqLM,
    "gpt2-reward": AutoModelForSequenceClassification,
    "llama-reward": AutoModelForSequenceClassification,
    "qwen2-reward": AutoModelForSequenceClassification,
}
# advertised sizes: tiny models "~1M", llama-small "~10M"
PARAM_RANGE = {name: (2e5, 2e6) for name in AUTO_CLASS} | {"llama-small": (5e6, 2e7)}
TEXTS = ["The movie was great fun.", "Awful plot."]


def test_names_match_the_documented_list():
    documented = (
        "gpt2",
        "llama",
        "qwen2",
        "t5",
        "gpt2-reward",
        "llama-reward",
        "qwen2-reward",
        "llama-small",
    )
    assert TINY_MODEL_NAMES == documented
    assert set(AUTO_CLASS) == set(documented)


@pytest.mark.parametrize("name", TINY_MODEL_NAMES)
def test_loads_with_plain_transformers_and_has_right_shapes(name):
    path = tiny_model_path(name)
    assert (path / "model.safetensors").is_file() and not list(path.glob("*.bin"))
    model = AUTO_CLASS[name].from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    lo, hi = PARAM_RANGE[name]
    assert lo <= model.num_parameters() <= hi
    assert model.config.pad_token_id == tok.pad_token_id != tok.eos_token_id
    assert model.config.eos_token_id == tok.eos_token_id

    batch = tok(TEXTS, padding=True, return_tensors="pt")
    B, T = batch["input_ids"].shape
    with torch.no_grad():
        if AUTO_CLASS[name] is AutoModelForSeq2SeqLM:
            decoder_input_ids = torch.full((B, 3), model.config.decoder_start_token_id)
            logits = model(**batch, decoder_input_ids=decoder_input_ids).logits
            expected = (B, 3, len(tok))
        elif AUTO_CLASS[name] is AutoModelForSequenceClassification:
            assert model.config.num_labels == 1
            logits, expected = model(**batch).logits, (B, 1)
        else:
            logits, expected = model(**batch).logits, (B, T, len(tok))
    assert logits.shape == expected
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2", "t5"])
def test_generate_from_left_padded_prompts(name):
    model = tiny_model(name).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_path(name))
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    prompt_len = 0 if model.config.is_encoder_decoder else batch["input_ids"].shape[1]
    assert out.shape[0] == 2 and out.shape[1] >= prompt_len + 4


@pytest.mark.parametrize("name", ["gpt2-reward", "llama-reward", "qwen2-reward"])
def test_reward_model_scores_the_last_real_token(name):
    # With pad_token_id in the config the classifier picks the last non-pad position, so right padding
    # must not change a sequence's score.
    model = tiny_model(name).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_path(name), padding_side="right")
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        padded = model(**batch).logits[1]
        alone = model(**tok(TEXTS[1:], return_tensors="pt")).logits[0]
    assert batch["input_ids"][1, -1] == tok.pad_token_id  # the short text really was padded
    torch.testing.assert_close(padded, alone)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_reward_model_shares_its_backbone_with_the_causal_lm(arch):
    lm, rm = tiny_model(arch), tiny_model(f"{arch}-reward")
    lm_state, rm_state = lm.base_model.state_dict(), rm.base_model.state_dict()
    assert lm_state.keys() == rm_state.keys()
    for key in lm_state:
        torch.testing.assert_close(lm_state[key], rm_state[key], rtol=0, atol=0)


def test_tiny_model_passes_kwargs_to_from_pretrained():
    model = tiny_model("llama", dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16


def test_unknown_name_lists_valid_ones(tmp_path):
    with pytest.raises(ValueError, match=r"unknown tiny model name 'gpt3'.*gpt2, llama, qwen2"):
        tiny_model_path("gpt3", cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # rejected before anything was built
    with pytest.raises(ValueError, match="valid names"):
        tiny_model("bert")


def test_tiny_value_head_model_silences_only_the_expected_warning():
    import warnings

    from rlhfkit import AutoModelForCausalLMWithValueHead

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = tiny_value_head_model("gpt2", summary_dropout_prob=0.0)
    assert isinstance(model, AutoModelForCausalLMWithValueHead)
    assert isinstance(model.v_head.dropout, torch.nn.Identity)  # from_pretrained kwargs reach the wrapper
    assert not [w for w in caught if "no value head found" in str(w.message)]
    with pytest.warns(UserWarning, match="no value head found"):  # the wrapper itself still warns
        AutoModelForCausalLMWithValueHead.from_pretrained(tiny_model_path("gpt2"))
