"""SFT's loss from hidden states in chunks equals transformers' causal-LM loss: values, gradients, runs."""

from __future__ import annotations

import logging

import datasets
import pytest
import torch
import torch.nn.functional as F
from transformers import Trainer

from rlhfkit.rollout import lm_head, scoring
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.testing.tokenizer import corpus_text
from rlhfkit.testing.training_args import few_step_args
from rlhfkit.trainers.sft.config import SFTConfig
from rlhfkit.trainers.sft.trainer import SFTTrainer

DOCS = corpus_text().splitlines()[:8]  # the tiny tokenizer's own sentences


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(padding_side="right")


def _trainer(tmp_path, tok, model, peft_config=None, **config):
    args = few_step_args(
        SFTConfig, tmp_path / "out", **{"per_device_train_batch_size": 2, "max_seq_length": 16, **config}
    )
    dataset = datasets.Dataset.from_list([{"text": d} for d in DOCS])
    return SFTTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tok, peft_config=peft_config
    )


def _batch(trainer):
    return trainer.data_collator([trainer.train_dataset[i] for i in range(3)])


def _hand_loss(model, batch, num_items):
    """Shifted cross-entropy over the full logits, -100 ignored: summed / num_items, or a mean when None."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = model(**inputs, use_cache=False).logits[:, :-1].float()
    labels = batch["labels"][:, 1:]
    summed = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum")
    return summed / (num_items if num_items is not None else (labels != -100).sum())


def _assert_matches_transformers(trainer, model, batch, num_items):
    """trainer.compute_loss equals transformers' own Trainer.compute_loss (full logits) and the hand loss."""
    model.eval()  # no dropout: the passes must see the same network
    params = [p for p in model.parameters() if p.requires_grad]
    want = Trainer.compute_loss(trainer, model, {**batch, "use_cache": False}, num_items_in_batch=num_items)
    want_grads = torch.autograd.grad(want, params)
    got = trainer.compute_loss(model, batch, num_items_in_batch=num_items)
    got_grads = torch.autograd.grad(got, params)
    assert got.shape == () and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(got, _hand_loss(model, batch, num_items), rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("arch", "tied"), [("gpt2", True), ("llama", False)])
@pytest.mark.parametrize("packing", [False, True])
def test_loss_matches_transformers(tmp_path, tok, chunk_calls, arch, tied, packing):
    model = tiny_model(arch)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    trainer = _trainer(tmp_path, tok, model, packing=packing)
    batch = _batch(trainer)
    assert ("position_ids" in batch) == packing and ("attention_mask" in batch) != packing
    assert trainer.model_accepts_loss_kwargs  # so num_items_in_batch divides the summed loss
    scored = int((batch["labels"][:, 1:] != -100).sum())
    # alone (a mean over this batch's label tokens), and as one of two accumulated micro-batches
    for num_items in (None, torch.tensor(scored + 7)):
        _assert_matches_transformers(trainer, model, batch, num_items)
    assert chunk_calls == [scored, scored]  # only the label rows were projected


def test_peft_model_loss_matches_transformers(tmp_path, tok, chunk_calls):
    from peft import LoraConfig

    lora = LoraConfig(
        task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    trainer = _trainer(tmp_path, tok, tiny_model("llama"), peft_config=lora)
    batch = _batch(trainer)
    _assert_matches_transformers(trainer, trainer.model, batch, torch.tensor(40))
    assert len(chunk_calls) == 1


def test_unplain_head_falls_back_to_full_logits(tmp_path, tok, chunk_calls, unplain_head_model, caplog):
    trainer = _trainer(tmp_path, tok, unplain_head_model)
    with caplog.at_level(logging.WARNING, logger=lm_head.logger.name):
        for num_items in (None, torch.tensor(30)):
            _assert_matches_transformers(trainer, unplain_head_model, _batch(trainer), num_items)
    assert chunk_calls == []
    assert ["not a plain torch.nn.Linear" in r.getMessage() for r in caplog.records] == [True]  # logged once


def test_outputs_and_label_smoothing_keep_the_logits_path(tmp_path, tok, chunk_calls):
    model = tiny_model("llama").eval()
    trainer = _trainer(tmp_path, tok, model)
    batch = _batch(trainer)
    with torch.no_grad():
        loss, outputs = trainer.compute_loss(model, batch, return_outputs=True)
        assert outputs.logits.shape == (*batch["input_ids"].shape, model.config.vocab_size)
        torch.testing.assert_close(loss, _hand_loss(model, batch, None))
        trainer.label_smoother = lambda *a, **k: torch.tensor(
            -1.0
        )  # stands in for transformers' LabelSmoother
        assert trainer.compute_loss(model, batch).item() == -1.0
    assert chunk_calls == []


def _train(tmp_path, tok, packing):
    trainer = _trainer(tmp_path, tok, tiny_model("llama"), packing=packing, gradient_accumulation_steps=2)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


@pytest.mark.parametrize("packing", [False, True])
def test_training_run_gives_the_same_losses_and_weights(tmp_path, tok, monkeypatch, packing):
    full_losses, full_params = _train(tmp_path / "full", tok, packing)
    monkeypatch.setattr(scoring, "CHUNKED_HEAD_MIN_LOGITS", 8)
    chunked_losses, chunked_params = _train(tmp_path / "chunked", tok, packing)
    assert len(full_losses) == 2
    assert chunked_losses == pytest.approx(full_losses, rel=1e-5)
    # Adam divides by the gradient's root mean square, which magnifies float rounding in near-zero
    # gradients: compare within a tenth of one step (lr 1e-3)
    for name, p in full_params.items():
        torch.testing.assert_close(chunked_params[name], p, rtol=1e-4, atol=1e-4)
