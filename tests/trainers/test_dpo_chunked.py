"""DPO's policy and reference passes score labels from hidden states in chunks: same values, gradients,
metrics."""

from __future__ import annotations

import logging

import datasets
import pytest
import torch

from rlhfkit.rollout import lm_head, scoring
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.testing.training_args import few_step_args
from rlhfkit.trainers.dpo.config import DPOConfig
from rlhfkit.trainers.dpo.trainer import DPOTrainer

ROWS = [
    {"prompt": "the plot: ", "chosen": "yes good fun", "rejected": "no"},
    {"prompt": "a much longer prompt here: ", "chosen": "ok", "rejected": "no bad at all really"},
    {"prompt": "music: ", "chosen": "the music was good", "rejected": "bad"},
]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(padding_side="right")


def _trainer(tmp_path, tok, model, n_pairs=3, peft_config=None, **config):
    rows = [ROWS[i % len(ROWS)] for i in range(n_pairs)]
    args = few_step_args(DPOConfig, tmp_path / "out", max_length=64, max_prompt_length=32, **config)
    dataset = datasets.Dataset.from_list(rows)
    return DPOTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tok, peft_config=peft_config
    )


def _batch(trainer, n=3):
    return trainer.data_collator([trainer.train_dataset[i] for i in range(n)])


def _straightforward(trainer, model, batch):
    """Full (2B, T, V) logits, a float32 log-softmax and the shifted labels: what the chunked path
    replaces."""
    inputs = trainer.concatenated_inputs(batch)
    logits = (
        model(
            input_ids=inputs["concatenated_input_ids"],
            attention_mask=inputs["concatenated_attention_mask"],
            use_cache=False,
        )
        .logits[:, :-1]
        .float()
    )
    labels = inputs["concatenated_labels"][:, 1:]
    mask = labels != trainer.label_pad_token_id
    logp = torch.log_softmax(logits, -1).gather(-1, torch.where(mask, labels, 0)[..., None]).squeeze(-1)
    logps = (logp * mask).sum(-1)
    means = (logits.detach().mean(-1) * mask).sum(1) / mask.sum(1)
    n = batch["chosen_input_ids"].shape[0]
    return logps[:n], logps[n:], means[:n], means[n:]


def _assert_same_values_and_grads(trainer, model, batch):
    model.eval()  # no dropout: both passes must see the same network
    params = [p for p in model.parameters() if p.requires_grad]
    a, b = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.3, 1.5, -1.0])
    want = _straightforward(trainer, model, batch)
    want_grads = torch.autograd.grad((a * want[0] + b * want[1]).sum(), params)
    got = trainer._concatenated_logps(model, batch, with_mean_logits=True)
    got_grads = torch.autograd.grad((a * got[0] + b * got[1]).sum(), params)
    for g, w in zip(got, want):
        assert g.shape == (3,)
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    # float32 sums in another order (vocabulary tiles against one log-softmax) move entries near zero by ~1e-6
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=5e-6)


@pytest.mark.parametrize(("arch", "tied"), [("gpt2", True), ("llama", False)])
def test_policy_pass_matches_full_logits(tmp_path, tok, chunk_calls, arch, tied):
    model = tiny_model(arch)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    trainer = _trainer(tmp_path, tok, model)
    batch = _batch(trainer)
    _assert_same_values_and_grads(trainer, model, batch)
    labels = trainer.concatenated_inputs(batch)["concatenated_labels"]
    assert chunk_calls == [int((labels[:, 1:] != -100).sum())]  # only the scored rows were projected


def test_peft_policy_and_its_adapter_free_reference(tmp_path, tok, chunk_calls):
    from peft import LoraConfig

    lora = LoraConfig(
        task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    trainer = _trainer(tmp_path, tok, tiny_model("llama"), peft_config=lora)
    assert trainer.reference.kind == "base"
    batch = _batch(trainer)
    _assert_same_values_and_grads(trainer, trainer.model, batch)
    ref_chosen, ref_rejected = trainer.reference_logps(batch)  # the policy with its adapters switched off
    assert len(chunk_calls) == 2
    with torch.no_grad():
        base = _straightforward(trainer, tiny_model("llama").eval(), batch)
    torch.testing.assert_close(ref_chosen, base[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref_rejected, base[1], rtol=1e-5, atol=1e-5)


def test_unplain_head_falls_back_to_full_logits(tmp_path, tok, chunk_calls, unplain_head_model, caplog):
    trainer = _trainer(tmp_path, tok, unplain_head_model)  # its reference copy has the same head
    batch = _batch(trainer)
    with caplog.at_level(logging.WARNING, logger=lm_head.logger.name):
        _assert_same_values_and_grads(trainer, unplain_head_model, batch)
        loss, metrics = trainer.get_batch_metrics(unplain_head_model, batch)  # policy and reference passes
    assert chunk_calls == []
    assert (
        loss.item() == pytest.approx(0.6931472, abs=1e-5) and metrics["logits/chosen"] != 0
    )  # log 2: same nets
    reasons = [r.getMessage() for r in caplog.records if "not a plain torch.nn.Linear" in r.getMessage()]
    assert len(reasons) == 1  # once per model class and reason


def test_concatenated_forward_still_returns_full_logits(tmp_path, tok, chunk_calls):
    model = tiny_model("llama").eval()
    trainer = _trainer(tmp_path, tok, model)
    batch = _batch(trainer)
    with torch.no_grad():
        chosen, rejected, logits_chosen, _ = trainer.concatenated_forward(model, batch)
        want = _straightforward(trainer, model, batch)
    assert logits_chosen.dim() == 3 and logits_chosen.shape[-1] == model.config.vocab_size
    torch.testing.assert_close(chosen, want[0], rtol=1e-5, atol=1e-5)
    assert chunk_calls == []  # a caller of the seed API asked for the logits


def _train_metrics(tmp_path, tok):
    trainer = _trainer(tmp_path, tok, tiny_model("llama"), n_pairs=8, gradient_accumulation_steps=2)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rewards/accuracies" in h]
    return logs, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def test_training_run_logs_the_same_metrics(tmp_path, tok, monkeypatch):
    full_logs, full_params = _train_metrics(tmp_path / "full", tok)
    monkeypatch.setattr(scoring, "CHUNKED_HEAD_MIN_LOGITS", 8)
    chunked_logs, chunked_params = _train_metrics(tmp_path / "chunked", tok)
    assert len(full_logs) == len(chunked_logs) == 2
    for full, chunked in zip(full_logs, chunked_logs):
        keys = [k for k in full if k.split("/")[0] in ("loss", "rewards", "logps", "logits")]
        assert {"logits/chosen", "logps/rejected", "rewards/margins", "loss"} <= set(keys)
        for key in keys:
            assert chunked[key] == pytest.approx(full[key], rel=1e-4, abs=1e-5), key
    # Adam divides by the gradient's root mean square, which magnifies float rounding in near-zero
    # gradients: compare within a tenth of one step (lr 1e-3)
    for name, p in full_params.items():
        torch.testing.assert_close(chunked_params[name], p, rtol=1e-4, atol=1e-4)
