"""The classic PPO and value-head API that TRL 0.11's own tests use: `prepare_model_inputs`,
`_kl_penalty`, `_step_safety_checker`, `lm_head_namings`, the value head's dropout from the model config,
a dataset of (query, response) tuples through the trainer's dataloader, and the warnings for a given
reference with `num_shared_layers` and for a trainer without a dataset."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

from rlhfkit import (
    AutoModelForCausalLMWithValueHead,
    AutoModelForSeq2SeqLMWithValueHead,
    PPOConfig,
    PPOTrainer,
)
from rlhfkit.testing import tiny_model_path, tiny_tokenizer, tiny_value_head_model


def _trainer(dataset=None, **config):
    tokenizer = tiny_tokenizer(padding_side="left")
    cfg = PPOConfig(batch_size=2, mini_batch_size=2, log_with=None, **config)
    return PPOTrainer(cfg, tiny_value_head_model("llama"), None, tokenizer, dataset=dataset)


def test_lm_head_namings_and_a_model_without_a_head():
    assert AutoModelForCausalLMWithValueHead.lm_head_namings == ("lm_head", "embed_out")
    assert "output_projection" in AutoModelForSeq2SeqLMWithValueHead.lm_head_namings
    with pytest.raises(ValueError, match="has no language-model head"):
        AutoModelForCausalLMWithValueHead(AutoModel.from_pretrained(tiny_model_path("llama")))


def test_value_head_dropout_from_the_config_or_the_keyword():
    path = str(tiny_model_path("llama"))
    pretrained = AutoModelForCausalLM.from_pretrained(path)
    pretrained.config.summary_dropout_prob = 0.5
    assert AutoModelForCausalLMWithValueHead.from_pretrained(pretrained).v_head.dropout.p == 0.5
    assert (
        AutoModelForCausalLMWithValueHead.from_pretrained(path, summary_dropout_prob=0.3).v_head.dropout.p
        == 0.3
    )
    assert AutoModelForCausalLMWithValueHead.from_pretrained(path).v_head.dropout.p == 0.1  # TRL's default


def test_prepare_model_inputs_pads_query_and_response_together():
    trainer = _trainer()
    queries = [torch.tensor([5, 6, 7]), torch.tensor([8])]
    responses = [torch.tensor([9, 10]), torch.tensor([11, 12])]
    inputs = trainer.prepare_model_inputs(queries, responses)
    assert set(inputs) == {"input_ids", "attention_mask"}
    pad = trainer.tokenizer.pad_token_id
    assert inputs["input_ids"].tolist() == [[5, 6, 7, 9, 10], [pad, pad, 8, 11, 12]]  # left padding
    assert inputs["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]


def test_kl_penalty_kinds_by_hand():
    logprob, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    expected = {"kl": [[0.5, -1.0]], "abs": [[0.5, 1.0]], "mse": [[0.125, 0.5]]}
    for kind, values in expected.items():
        trainer = _trainer(kl_penalty=kind)
        torch.testing.assert_close(trainer._kl_penalty(logprob, ref), torch.tensor(values))
    p, q = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.4, 0.4, 0.2])
    full = _trainer(kl_penalty="full")._kl_penalty(p.log()[None, None], q.log()[None, None])
    assert full.item() == pytest.approx(float((p * (p / q).log()).sum()), rel=1e-5)


def test_a_dataset_of_query_response_tuples_trains_through_the_dataloader():
    query, response = torch.tensor([5, 6, 7, 8]), torch.tensor([9, 10, 11, 12])
    trainer = _trainer(dataset=[(query, response), (query, response)])
    for queries, responses in trainer.dataloader:  # torch's collation: stacked (2, 4) tensors
        assert queries.shape == (2, 4)
        stats = trainer.step(list(queries), list(responses), [torch.tensor(1.0), torch.tensor(0.0)])
        assert "ppo/loss/total" in stats


def test_num_shared_layers_with_a_given_reference_warns_and_keeps_that_reference():
    tokenizer = tiny_tokenizer(padding_side="left")
    policy, ref = tiny_value_head_model("llama"), tiny_value_head_model("llama")
    config = PPOConfig(batch_size=2, mini_batch_size=2, log_with=None)
    with pytest.warns(UserWarning, match="num_shared_layers=1 is ignored because ref_model is given"):
        trainer = PPOTrainer(config, policy, ref, tokenizer, dataset=[[5, 6]] * 2, num_shared_layers=1)
    assert trainer.ref_model is ref
    # nothing was shared or frozen in the policy: every one of its weights still trains
    ref_tensors = {p.data_ptr() for p in ref.parameters()}
    assert all(p.requires_grad and p.data_ptr() not in ref_tensors for p in trainer.model.parameters())


def test_no_dataset_warns_about_the_batch_size_step_will_expect():
    with pytest.warns(UserWarning, match=r"no dataset given.*config.batch_size=2"):
        trainer = _trainer()
    assert trainer.dataloader is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _trainer(dataset=[[5, 6]] * 2)  # with prompts there is nothing to warn about


def test_step_safety_checker_normalises_and_checks_step_inputs():
    trainer = _trainer(dataset=[[5, 6]] * 2)
    queries = [torch.tensor([[5, 6, 7]]), torch.tensor([8, 9])]  # a (1, L) row, as tokenizers return it
    responses = [torch.tensor([10, 11]), torch.tensor([12])]
    q, r, scores, masks = trainer._step_safety_checker(2, queries, responses, [1, torch.tensor([0.5])])
    assert [t.tolist() for t in q] == [[5, 6, 7], [8, 9]] and [t.tolist() for t in r] == [[10, 11], [12]]
    assert [s.item() for s in scores] == [1.0, 0.5] and all(s.dim() == 0 for s in scores)
    assert scores[0].dtype == torch.float32 and masks is None
    with pytest.raises(ValueError, match="config.batch_size is 3"):
        trainer._step_safety_checker(3, queries, responses, [1.0, 0.5])


def test_loss_names_logits_of_the_wrong_shape():
    trainer = _trainer(dataset=[[5, 6]] * 2)
    x, mask = torch.zeros(1, 3), torch.ones(1, 3)
    with pytest.raises(ValueError, match=r"logits must be \(b, R, vocab\).*got shape \(1, 3\)"):
        trainer.loss(x, x, x, x, x, mask, x, x)
    pg_loss, vf_loss, stats = trainer.loss(x, x, torch.zeros(1, 3, 5), x, x, mask, x, x)
    # uniform logits over 5 tokens: entropy log 5 on every token
    assert stats["policy/entropy"].item() == pytest.approx(math.log(5), rel=1e-5)
