"""DPOTrainer: hand-checked losses, log-probs vs a naive loop, references, precompute, learning."""

from __future__ import annotations

import math
import random

import datasets
import pytest
import torch
import torch.nn.functional as F

from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.testing.training_args import few_step_args
from rlhfkit.trainers.dpo.config import DPOConfig
from rlhfkit.trainers.dpo.trainer import DPOTrainer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(padding_side="right")


def _config(tmp_path, **kw):
    return few_step_args(DPOConfig, tmp_path / "out", **{"max_length": 64, "max_prompt_length": 32, **kw})


def _pairs(n, seed=0):
    """Learnable preferences: chosen answers say 'yes good', rejected ones 'no bad', after varied prompts."""
    rng = random.Random(seed)
    words = ["the", "movie", "was", "plot", "actors", "music", "story", "film"]
    return datasets.Dataset.from_list(
        [
            {"prompt": " ".join(rng.choices(words, k=3)) + ": ", "chosen": "yes good", "rejected": "no bad"}
            for _ in range(n)
        ]
    )


def test_dpo_loss_variants_hand_checked(tmp_path, tok):
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_config(tmp_path, beta=0.1),
        train_dataset=_pairs(4),
        processing_class=tok,
    )
    pc, pr, rc, rr = (torch.tensor([v]) for v in (-1.0, -2.0, -1.5, -1.5))
    # logits = (pc - pr) - (rc - rr) = 1; sigmoid loss = -log sigmoid(0.1 * 1) = log(1 + e^-0.1)
    losses, chosen, rejected = trainer.dpo_loss(pc, pr, rc, rr)
    assert losses.item() == pytest.approx(math.log1p(math.exp(-0.1)), rel=1e-6)
    assert chosen.item() == pytest.approx(0.05) and rejected.item() == pytest.approx(-0.05)  # 0.1 * (+-0.5)
    # reference-free: logits = pc - pr = 1 as well here, rewards are 0.1 * policy logps
    losses_free, chosen_free, _ = trainer.dpo_loss(pc, pr, rc, rr, reference_free=True)
    assert losses_free.item() == pytest.approx(math.log1p(math.exp(-0.1)), rel=1e-6)
    assert chosen_free.item() == pytest.approx(-0.1)
    trainer.loss_type = "hinge"  # relu(1 - 0.1 * 1) = 0.9
    assert trainer.dpo_loss(pc, pr, rc, rr)[0].item() == pytest.approx(0.9)
    trainer.loss_type = "ipo"  # (1 - 1 / (2 * 0.1))^2 = 16
    assert trainer.dpo_loss(pc, pr, rc, rr)[0].item() == pytest.approx(16.0)
    trainer.loss_type = "sigmoid"
    trainer.args.label_smoothing = 0.2  # -(0.8 log s(0.1) + 0.2 log s(-0.1))
    expected = -(0.8 * F.logsigmoid(torch.tensor(0.1)) + 0.2 * F.logsigmoid(torch.tensor(-0.1))).item()
    assert trainer.dpo_loss(pc, pr, rc, rr)[0].item() == pytest.approx(expected, rel=1e-6)


def test_concatenated_forward_matches_naive_loop(tmp_path, tok):
    model = tiny_model("llama").eval()
    ds = datasets.Dataset.from_list(
        [
            {"prompt": "the plot: ", "chosen": "yes good fun", "rejected": "no"},
            {"prompt": "a much longer prompt here: ", "chosen": "ok", "rejected": "no bad at all really"},
        ]
    )
    trainer = DPOTrainer(model=model, args=_config(tmp_path), train_dataset=ds, processing_class=tok)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    labels = trainer.concatenated_inputs(batch)["concatenated_labels"]
    first = min(int((row != -100).nonzero()[0]) for row in labels)  # the earliest scored position
    keep = labels.shape[1] - (first - 1)
    assert trainer._logits_to_keep(model, labels) == keep  # only prompt columns dropped
    with torch.no_grad():
        chosen, rejected, logits_chosen, logits_rejected = trainer.concatenated_forward(model, batch)
        assert logits_chosen.shape == (2, keep, model.config.vocab_size) == logits_rejected.shape
        mean_chosen = trainer._mean_response_logit(logits_chosen, labels[:2])
        mean_rejected = trainer._mean_response_logit(logits_rejected, labels[2:])
        sides = (
            ("chosen", chosen, logits_chosen, mean_chosen),
            ("rejected", rejected, logits_rejected, mean_rejected),
        )
        for i, row in enumerate(trainer.train_dataset):
            for side, got, got_logits, got_mean in sides:
                prompt, response = row["prompt_ids"], row[f"{side}_ids"]
                ids = torch.tensor([prompt + response])
                logits = model(input_ids=ids).logits[0]
                logp = F.log_softmax(logits, -1)
                naive = sum(logp[len(prompt) + j - 1, t].item() for j, t in enumerate(response))
                assert got[i].item() == pytest.approx(naive, abs=1e-4)
                # per-token logits (right padding): column c of the kept block is position first - 1 + c
                scoring = logits[len(prompt) - 1 : len(prompt) + len(response) - 1]
                start = len(prompt) - 1 - (first - 1)
                torch.testing.assert_close(
                    got_logits[i, start : start + len(response)], scoring, atol=1e-4, rtol=1e-4
                )
                # the logged mean logit: over the vocabulary at the positions that predict the response
                assert got_mean[i].item() == pytest.approx(scoring.mean().item(), abs=1e-4)


def test_full_model_moves_and_reference_stays_frozen(tmp_path, tok):
    model = tiny_model("llama")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = DPOTrainer(model=model, args=_config(tmp_path), train_dataset=_pairs(8), processing_class=tok)
    assert trainer.ref_model is not None and trainer.ref_model is not model
    trainer.train()
    for name, p in model.named_parameters():
        assert not torch.equal(p, before[name]), f"{name} did not move"
    for name, p in trainer.ref_model.named_parameters():
        assert torch.equal(p, before[name]) and not p.requires_grad
    logged = [h for h in trainer.state.log_history if "rewards/accuracies" in h]
    keys = {
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "logps/chosen",
        "logps/rejected",
        "logits/chosen",
        "logits/rejected",
    }
    assert logged and keys <= set(logged[0])


def test_peft_reference_is_the_adapter_free_base_and_precompute_agrees(tmp_path, tok):
    from peft import LoraConfig

    base = tiny_model("llama")
    base_copy = tiny_model("llama").eval()
    lora = LoraConfig(
        task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    trainer = DPOTrainer(
        model=base,
        args=_config(tmp_path, precompute_ref_log_probs=True),
        train_dataset=_pairs(8),
        processing_class=tok,
        peft_config=lora,
    )
    assert trainer.ref_model is None and trainer.reference.kind == "base"
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    with torch.no_grad():
        ref_c, ref_r = trainer.reference_logps(batch)
        base_c, base_r, _, _ = trainer.concatenated_forward(base_copy, batch)
        pol_c, _, _, _ = trainer.concatenated_forward(trainer.model, batch)
    torch.testing.assert_close(ref_c, base_c, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref_r, base_r, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(pol_c, base_c)  # the (non-zero) adapters are on for the policy
    trainer.train()
    cols = trainer.train_dataset.column_names
    assert "reference_chosen_logps" in cols and "reference_rejected_logps" in cols
    pre = trainer.train_dataset[:4]
    torch.testing.assert_close(torch.tensor(pre["reference_chosen_logps"]), base_c, atol=1e-4, rtol=1e-4)


def test_get_batch_samples_generates_for_policy_and_reference(tmp_path, tok):
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_config(tmp_path, max_new_tokens_eval=3),
        train_dataset=_pairs(4),
        processing_class=tok,
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    policy, reference = trainer.get_batch_samples(trainer.model, batch)
    assert len(policy) == 2 and len(reference) == 2 and all(isinstance(t, str) for t in policy + reference)


def test_bad_inputs_raise_clear_errors(tmp_path, tok):
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="identical"):
        DPOTrainer(
            model=model,
            args=_config(tmp_path),
            processing_class=tok,
            train_dataset=datasets.Dataset.from_list([{"prompt": "q", "chosen": "a", "rejected": "a"}] * 2),
        )
    with pytest.raises(ValueError, match="empty"):
        DPOTrainer(
            model=model, args=_config(tmp_path), processing_class=tok, train_dataset=_pairs(2).select([])
        )
    with pytest.raises(ValueError, match="loss_type"):
        _config(tmp_path, loss_type="nope")
    with pytest.raises(ValueError, match="truncation_mode"):
        DPOTrainer(
            model=model,
            args=_config(tmp_path),
            processing_class=tok,
            train_dataset=_pairs(2),
            truncation_mode="middle",
        )
    with pytest.raises(ValueError, match="must not be the policy"):
        DPOTrainer(
            model=model,
            ref_model=model,
            args=_config(tmp_path),
            processing_class=tok,
            train_dataset=_pairs(2),
        )


@pytest.mark.slow
def test_implicit_reward_accuracy_rises(tmp_path, tok):
    args = _config(tmp_path, max_steps=12, per_device_train_batch_size=8, learning_rate=2e-3, beta=0.1)
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=args,
        train_dataset=_pairs(96, seed=1),
        eval_dataset=_pairs(32, seed=2),
        processing_class=tok,
    )
    before = trainer.evaluate()
    assert before["eval_rewards/accuracies"] == 0.0  # policy == reference: every implicit reward is 0
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_rewards/accuracies"] >= 0.9, after
    assert after["eval_rewards/margins"] > 0 and after["eval_loss"] < math.log(2)


def test_batch_four_equals_batch_one_with_four_accumulation_steps(tmp_path, tok):
    """One SGD step on the same 4 pairs: one batch of 4, or 4 micro-batches of 1 accumulated."""
    results = []
    for batch_size, accumulation in ((4, 1), (1, 4)):
        model = tiny_model("llama")
        args = _config(
            tmp_path,
            max_steps=1,
            optim="sgd",
            learning_rate=0.5,
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation,
            lr_scheduler_type="constant",
            max_grad_norm=0.0,
        )
        trainer = DPOTrainer(model=model, args=args, train_dataset=_pairs(4), processing_class=tok)
        trainer.train()
        results.append({n: p.detach().clone() for n, p in model.named_parameters()})
    for name, value in results[0].items():
        torch.testing.assert_close(results[1][name], value, atol=1e-5, rtol=1e-4)


def test_reference_free_uses_no_reference(tmp_path, tok):
    trainer = DPOTrainer(
        model=tiny_model("llama"),
        args=_config(tmp_path, reference_free=True),
        train_dataset=_pairs(4),
        processing_class=tok,
    )
    assert trainer.ref_model is None and trainer.reference is None
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    ref_c, ref_r = trainer.reference_logps(batch)
    assert ref_c.tolist() == [0.0, 0.0] and ref_r.tolist() == [0.0, 0.0]
    trainer.train()


def _first_batch(trainer):
    return trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))


def test_the_sft_loss_is_the_chosen_tokens_nll_and_losses_combine_by_weight(tmp_path, tok):
    model, data = tiny_model("llama").eval(), _pairs(4)

    def trainer(**kwargs):
        config = _config(tmp_path, per_device_train_batch_size=4, **kwargs)
        return DPOTrainer(model=model, ref_model=tiny_model("llama"), args=config, train_dataset=data,
                          processing_class=tok)  # fmt: skip

    sft = trainer(loss_type="sft")
    batch = _first_batch(sft)
    with torch.no_grad():
        sft_loss, _ = sft.get_batch_metrics(model, batch)
        # by hand: every chosen completion token's -log p, averaged over all of them in the batch
        ids, mask = batch["chosen_input_ids"], batch["chosen_attention_mask"]
        logits = model(input_ids=ids, attention_mask=mask).logits
        labels = batch["chosen_labels"][:, 1:]
        logp = torch.log_softmax(logits[:, :-1].float(), -1)
        scored = labels != -100
        picked = logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
        assert sft_loss.item() == pytest.approx(-(picked[scored]).mean().item(), rel=1e-5)
        sigmoid_loss, _ = trainer(loss_type="sigmoid").get_batch_metrics(model, batch)
        combo = trainer(loss_type=["sigmoid", "sft"], loss_weights=[1.0, 0.5])
        combo_loss, _ = combo.get_batch_metrics(model, batch)
    assert combo_loss.item() == pytest.approx(sigmoid_loss.item() + 0.5 * sft_loss.item(), rel=1e-5)


@pytest.mark.parametrize("loss_type", ["ipo", "apo_zero", "discopop", "aot", "robust"])
def test_menu_losses_train(tmp_path, tok, loss_type):
    config = _config(tmp_path, loss_type=loss_type, label_smoothing=0.1 if loss_type == "robust" else 0.0)
    model = tiny_model("llama")
    trainer = DPOTrainer(model=model, args=config, train_dataset=_pairs(8), processing_class=tok)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses and all(math.isfinite(v) for v in losses)


def test_loss_type_checks(tmp_path):
    assert _config(tmp_path, loss_type="ipo").loss_type == ["ipo"]  # TRL 0.x's single name
    with pytest.raises(ValueError, match="loss_weights has 1 entries for 2"):
        _config(tmp_path, loss_type=["sigmoid", "sft"], loss_weights=[1.0])
    with pytest.raises(ValueError, match="f_divergence_type must be one of"):
        _config(tmp_path, f_divergence_type="tv")
