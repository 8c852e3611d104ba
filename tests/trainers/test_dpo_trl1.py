"""DPOTrainer's TRL 1.x options change what trains: LD-DPO, WPO, TR-DPO syncing, the precompute batch size,
padding, and TRL 1.x's collator batch (same loss as the default one)."""

from __future__ import annotations

import logging

import datasets
import pytest
import torch

from rlhfkit.core.losses import dpo_loss
from rlhfkit.core.preference_weights import length_desensitised_logps, log_sum_squared_probs
from rlhfkit.data.collators import DataCollatorForPreference, cat_padded
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.testing.training_args import few_step_args
from rlhfkit.trainers.dpo.config import DPOConfig
from rlhfkit.trainers.dpo.trainer import DPOTrainer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(padding_side="right")


def _config(tmp_path, **kw):
    return few_step_args(DPOConfig, tmp_path / "out", **{"max_length": 64, "max_prompt_length": 32, **kw})


def _pairs(n):
    """Responses of unequal lengths, so LD-DPO's tail is not empty."""
    rows = [
        {"prompt": f"the movie {i}: ", "chosen": "yes good and really quite good", "rejected": "no bad"}
        for i in range(n)
    ]
    return datasets.Dataset.from_list(rows)


def _trainer(tmp_path, tok, n=4, **kw):
    return DPOTrainer(
        model=tiny_model("llama"), args=_config(tmp_path, **kw), train_dataset=_pairs(n), processing_class=tok
    )


def _naive_token_logps(model, batch):
    """(2B, T-1) per-token log-probs of the response tokens and their mask, from a plain full forward."""
    ids = cat_padded(batch["chosen_input_ids"], batch["rejected_input_ids"], 0)
    mask = cat_padded(batch["chosen_attention_mask"], batch["rejected_attention_mask"], 0)
    labels = cat_padded(batch["chosen_labels"], batch["rejected_labels"], -100)[:, 1:]
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    scored = labels != -100
    logps = torch.log_softmax(logits, -1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return logps * scored, scored, logits


def test_trl1_collator_batch_gives_the_default_batch_loss(tmp_path, tok):
    trainer = _trainer(tmp_path, tok)
    rows = [trainer.train_dataset[i] for i in range(4)]
    trl1 = DataCollatorForPreference(pad_token_id=trainer.padding_value)(rows)
    with torch.no_grad():
        loss, metrics = trainer.get_batch_metrics(trainer.model, trainer.data_collator(rows))
        loss_trl1, metrics_trl1 = trainer.get_batch_metrics(trainer.model, trl1)
    torch.testing.assert_close(loss_trl1, loss)
    assert metrics_trl1 == pytest.approx(metrics, rel=1e-5, abs=1e-6)
    prompts = trainer._prompt_batch(trl1)[0]  # generation prompts rebuilt from the stacked rows
    assert prompts[0, -len(rows[0]["prompt_ids"]) :].tolist() == rows[0]["prompt_ids"]


def test_ld_alpha_weights_the_tail_of_policy_and_reference(tmp_path, tok):
    trainer = _trainer(tmp_path, tok, ld_alpha=0.25)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    with torch.no_grad():
        logps, mask, _ = _naive_token_logps(trainer.model, batch)
        scored = trainer._scored_pass(trainer.model, batch)
        ref_chosen, ref_rejected = trainer.reference_logps(batch)
    expected = length_desensitised_logps(logps, mask, 0.25)
    assert not torch.allclose(expected, logps.sum(1))  # the tail matters in this data
    torch.testing.assert_close(torch.cat([scored.chosen, scored.rejected]), expected, atol=1e-5, rtol=1e-5)
    # the reference is a copy of the untrained policy: the same LD-weighted numbers
    torch.testing.assert_close(torch.cat([ref_chosen, ref_rejected]), expected, atol=1e-5, rtol=1e-5)


def test_use_weighting_scales_each_pair_by_wpo_weights(tmp_path, tok):
    trainer = _trainer(tmp_path, tok, use_weighting=True)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    with torch.no_grad():
        logps, mask, logits = _naive_token_logps(trainer.model, batch)
        loss, _ = trainer.get_batch_metrics(trainer.model, batch)
    sums = logps.sum(1)
    losses, _, _ = dpo_loss(sums[:2], sums[2:], sums[:2], sums[2:], beta=0.1)  # reference = policy here
    mean_aligned = ((logps - log_sum_squared_probs(logits)) * mask).sum(1) / mask.sum(1)
    weights = mean_aligned.exp()[:2] * mean_aligned.exp()[2:]
    assert not torch.allclose(weights, torch.ones(2))
    torch.testing.assert_close(loss, (losses * weights).mean(), atol=1e-5, rtol=1e-5)


def test_sync_ref_model_mixes_the_policy_into_the_reference(tmp_path, tok):
    trainer = _trainer(
        tmp_path, tok, sync_ref_model=True, ref_model_mixup_alpha=0.5, ref_model_sync_steps=1, max_steps=1
    )
    ref_before = {n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()}
    trainer.train()
    policy = dict(trainer.model.named_parameters())
    for name, param in trainer.ref_model.named_parameters():
        torch.testing.assert_close(param, 0.5 * policy[name].detach() + 0.5 * ref_before[name])
    assert any(not torch.equal(p, ref_before[n]) for n, p in trainer.ref_model.named_parameters())


def test_sync_ref_model_refuses_what_it_cannot_sync(tmp_path, tok):
    from peft import LoraConfig

    with pytest.raises(ValueError, match="sync_ref_model cannot be combined with precompute_ref_log_probs"):
        _config(tmp_path, sync_ref_model=True, precompute_ref_log_probs=True)
    with pytest.raises(ValueError, match="nothing to sync"):
        DPOTrainer(
            model=tiny_model("llama"),
            args=_config(tmp_path, sync_ref_model=True),
            train_dataset=_pairs(4),
            processing_class=tok,
            peft_config=LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["q_proj"]),
        )


def test_precompute_ref_batch_size_sets_the_reference_batches(tmp_path, tok):
    sizes = {}
    for batch_size in (None, 8):
        trainer = _trainer(
            tmp_path,
            tok,
            n=8,
            precompute_ref_log_probs=True,
            precompute_ref_batch_size=batch_size,
            max_steps=1,
        )
        seen, inner = [], trainer.reference_logps

        def counting(batch, seen=seen, inner=inner):
            seen.append(batch["chosen_input_ids"].shape[0])
            return inner(batch)

        trainer.reference_logps = counting
        trainer.get_train_dataloader()
        sizes[batch_size] = seen
    assert sizes[None] == [4, 4]  # per_device_train_batch_size for the train set
    assert sizes[8] == [8]


def test_pad_to_multiple_of_and_pad_token(tmp_path, tok):
    local = tiny_tokenizer(padding_side="right")
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_config(tmp_path, pad_to_multiple_of=16, pad_token=local.eos_token),
        train_dataset=_pairs(4),
        processing_class=local,
    )
    assert local.pad_token == local.eos_token and trainer.padding_value == local.eos_token_id
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    assert batch["chosen_input_ids"].shape[1] % 16 == 0 and batch["chosen_labels"].shape[1] % 16 == 0
    assert _config(tmp_path, pad_to_multiple_of="auto").pad_to_multiple_of is None  # TRL 1.x's default
    with pytest.raises(ValueError, match="pad_to_multiple_of must be"):
        _config(tmp_path, pad_to_multiple_of="eight")
    with pytest.raises(ValueError, match="pad_token='<nope>' is not in the tokenizer's vocabulary"):
        DPOTrainer(
            model=tiny_model("llama"),
            args=_config(tmp_path, pad_token="<nope>"),
            train_dataset=_pairs(4),
            processing_class=tiny_tokenizer(padding_side="right"),
        )


def test_padding_free_warns_and_trains_padded(tmp_path, tok, caplog):
    with caplog.at_level(logging.WARNING):
        trainer = _trainer(tmp_path, tok, padding_free=True, max_steps=1)
    assert "padding_free=True is not applied" in caplog.text
    assert trainer.train().training_loss > 0


def test_iterable_dataset_trains(tmp_path, tok):
    model = tiny_model("llama")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = DPOTrainer(
        model=model,
        args=_config(tmp_path, dataset_num_proc=2),
        train_dataset=_pairs(8).to_iterable_dataset(),
        processing_class=tok,
    )
    trainer.train()
    assert all(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    with pytest.raises(ValueError, match="map-style"):
        DPOTrainer(
            model=tiny_model("llama"),
            args=_config(tmp_path, precompute_ref_log_probs=True),
            train_dataset=_pairs(8).to_iterable_dataset(),
            processing_class=tok,
        )


def test_option_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"ld_alpha must be in \[0, 1\]"):
        _config(tmp_path, ld_alpha=1.5)
    with pytest.raises(ValueError, match="use_weighting cannot be combined with loss_type 'aot'"):
        _config(tmp_path, use_weighting=True, loss_type=["aot"])
    with pytest.raises(ValueError, match="ref_model_sync_steps must be >= 1"):
        _config(tmp_path, ref_model_sync_steps=0)
    with pytest.raises(ValueError, match="precompute_ref_batch_size must be a positive integer"):
        _config(tmp_path, precompute_ref_batch_size=0)


def test_ld_alpha_on_the_chunked_head_path_and_wpo_off_it(tmp_path, tok, chunk_calls):
    trainer = _trainer(tmp_path, tok, ld_alpha=0.25)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    with torch.no_grad():
        logps, mask, _ = _naive_token_logps(trainer.model, batch)
        scored = trainer._scored_pass(trainer.model, batch)
    assert len(chunk_calls) == 1  # large-vocabulary path: no (2B, T, V) logits
    expected = length_desensitised_logps(logps, mask, 0.25)
    torch.testing.assert_close(torch.cat([scored.chosen, scored.rejected]), expected, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        weighted = trainer._scored_pass(trainer.model, batch, with_weights=True)
    assert len(chunk_calls) == 1 and weighted.weights.shape == (2,)  # WPO needs the full distribution
    torch.testing.assert_close(weighted.chosen, scored.chosen, atol=1e-5, rtol=1e-5)
