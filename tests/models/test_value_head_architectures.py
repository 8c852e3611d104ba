"""The value-head wrappers find the output projection of architectures that do not call it `lm_head`.

FSMT keeps its vocabulary projection as the decoder's (tied) embedding, reachable only through
`get_output_embeddings()`; other code names it `embed_out` or `output_projection`. Models are built
here from tiny configs with random weights (no downloads).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import (
    FSMTConfig,
    FSMTForConditionalGeneration,
    T5Config,
    T5Model,
)

from rlhfkit import AutoModelForSeq2SeqLMWithValueHead
from rlhfkit.models.value_head import output_head


def tiny_fsmt() -> FSMTForConditionalGeneration:
    torch.manual_seed(0)
    config = FSMTConfig(
        langs=["en", "de"], src_vocab_size=40, tgt_vocab_size=40, d_model=16, encoder_layers=1,
        decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
    )  # fmt: skip
    return FSMTForConditionalGeneration(config)


def test_fsmt_head_is_found_through_get_output_embeddings():
    model = tiny_fsmt()
    assert not any(hasattr(model, name) for name in AutoModelForSeq2SeqLMWithValueHead.lm_head_namings)
    assert (
        output_head(model, AutoModelForSeq2SeqLMWithValueHead.lm_head_namings)
        is model.get_output_embeddings()
    )


def test_fsmt_value_head_gives_one_value_per_decoder_token():
    wrapper = AutoModelForSeq2SeqLMWithValueHead(tiny_fsmt(), summary_dropout_prob=0.0)
    wrapper.eval()
    input_ids = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 11, 12, 2]])
    decoder_input_ids = torch.tensor([[2, 5, 6], [2, 9, 10]])
    logits, loss, values = wrapper(input_ids, decoder_input_ids=decoder_input_ids)
    assert logits.shape == (2, 3, 40) and loss is None
    assert values.shape == (2, 3) and values.dtype == torch.float32
    hidden = wrapper.pretrained_model(
        input_ids, decoder_input_ids=decoder_input_ids, output_hidden_states=True
    ).decoder_hidden_states[-1]
    expected = hidden @ wrapper.v_head.summary.weight[0] + wrapper.v_head.summary.bias[0]
    torch.testing.assert_close(values, expected)


def test_fsmt_round_trips_through_save_pretrained(tmp_path):
    wrapper = AutoModelForSeq2SeqLMWithValueHead(tiny_fsmt())
    nn.init.constant_(wrapper.v_head.summary.bias, 0.75)
    wrapper.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLMWithValueHead.from_pretrained(tmp_path)
    assert loaded.v_head.summary.bias.item() == 0.75
    for name, tensor in wrapper.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, msg=name)


def test_a_model_without_any_output_projection_is_refused():
    bare = T5Model(T5Config(vocab_size=40, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8))
    assert output_head(bare, AutoModelForSeq2SeqLMWithValueHead.lm_head_namings) is None
    with pytest.raises(ValueError, match="T5Model has no language-model head.*AutoModelForSeq2SeqLM"):
        AutoModelForSeq2SeqLMWithValueHead(bare)


def test_a_head_nested_under_another_module_is_found_by_its_name():
    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.output_projection = nn.Linear(4, 8)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder = Decoder()

    model = Model()
    found = output_head(model, ("lm_head", "output_projection"))
    assert found is model.decoder.output_projection
    assert output_head(model, ("lm_head",)) is None
    model.embed_out = nn.Linear(4, 8)  # a top-level attribute wins over a nested module
    assert output_head(model, ("embed_out", "output_projection")) is model.embed_out
