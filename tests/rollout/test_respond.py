"""`respond_to_batch` and `LengthSampler` importable from `rlhfkit.core` (TRL's `trl.core`)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rlhfkit.testing import tiny_tokenizer, tiny_value_head_model


@pytest.fixture(scope="module")
def model():
    return tiny_value_head_model("llama", summary_dropout_prob=0.0)


def test_import_core_stays_torch_only():
    code = "import sys, rlhfkit.core; assert 'transformers' not in sys.modules, 'transformers was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_core_reexports_the_rollout_length_sampler():
    from rlhfkit.core import LengthSampler
    from rlhfkit.rollout import LengthSampler as RolloutLengthSampler

    assert LengthSampler is RolloutLengthSampler
    assert {LengthSampler(2, 4)() for _ in range(50)} == {2, 3}


def test_respond_to_batch_samples_exactly_txt_len_tokens(model):
    from rlhfkit.core import respond_to_batch

    tokenizer = tiny_tokenizer()
    query = tokenizer.encode("the film was", return_tensors="pt")
    queries = torch.cat([query, query, query])
    model.train()
    responses = respond_to_batch(model, queries, txt_len=7)
    assert responses.shape == (3, 7) and responses.dtype == torch.long
    assert all(m.training for m in model.modules())  # sampled in eval mode, the caller's mode restored
    # top_k=1 is greedy: every row continues the same query the same way, as the argmax does
    greedy = respond_to_batch(model, queries, txt_len=4, top_k=1)
    assert (greedy == greedy[0]).all()
    with torch.no_grad():
        first = model(input_ids=query)[0][0, -1].argmax()
    assert greedy[0, 0] == first


def test_respond_to_batch_rejects_bad_arguments(model):
    from rlhfkit.core import respond_to_batch

    with pytest.raises(ValueError, match="queries"):
        respond_to_batch(model, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="txt_len"):
        respond_to_batch(model, torch.tensor([[1, 2, 3]]), txt_len=0)
    with pytest.raises(ValueError, match="top_p"):
        respond_to_batch(model, torch.tensor([[1, 2, 3]]), top_p=0.0)
