"""RewardTrainer: hand-checked loss, parameters that move, LoRA reward-adapter round trip, learning."""

from __future__ import annotations

import json
import random

import datasets
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from transformers import EvalPrediction

from rlhfkit.testing import tiny_model, tiny_model_path, tiny_tokenizer
from rlhfkit.testing.training_args import few_step_args
from rlhfkit.trainers.reward_model.config import RewardConfig
from rlhfkit.trainers.reward_model.trainer import RewardTrainer, compute_accuracy


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(padding_side="right")


def _config(tmp_path, **kw):
    return few_step_args(RewardConfig, tmp_path / "out", **kw)


def _pairs(n, seed=0):
    """Separable preferences: the chosen text contains 'excellent', the rejected one 'terrible'."""
    rng = random.Random(seed)
    words = ["the", "movie", "was", "plot", "actors", "music", "really", "quite", "story", "film"]
    rows = []
    for _ in range(n):
        prompt = " ".join(rng.choices(words, k=3))
        tail = " ".join(rng.choices(words, k=2))
        rows.append({"prompt": prompt + " ", "chosen": f"excellent {tail}", "rejected": f"terrible {tail}"})
    return datasets.Dataset.from_list(rows)


def test_compute_accuracy_counts_ties_as_half():
    preds = np.array([[2.0, 1.0], [0.0, 1.0], [3.0, 3.0], [5.0, -1.0]])
    # wins: 1 + 0 + 0.5 + 1 = 2.5 of 4
    assert compute_accuracy(EvalPrediction(predictions=preds, label_ids=np.zeros(4)))["accuracy"] == 0.625


def test_loss_matches_hand_computation(tmp_path, tok):
    model = tiny_model("llama-reward")
    ds = _pairs(4).add_column("margin", [0.0, 1.0, 0.5, 2.0])
    trainer = RewardTrainer(
        model=model,
        args=_config(tmp_path, center_rewards_coefficient=0.1),
        train_dataset=ds,
        processing_class=tok,
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    model.eval()
    with torch.no_grad():
        loss, out = trainer.compute_loss(model, batch, return_outputs=True)

        # reference: score every sequence on its own, without padding
        def score(ids):
            return model(input_ids=torch.tensor([ids])).logits[0, 0]

        rc = torch.stack([score(trainer.train_dataset[i]["chosen_ids"]) for i in range(4)])
        rr = torch.stack([score(trainer.train_dataset[i]["rejected_ids"]) for i in range(4)])
    margin = torch.tensor([0.0, 1.0, 0.5, 2.0])
    expected = -F.logsigmoid(rc - rr - margin).mean() + 0.1 * ((rc + rr) ** 2).mean()
    torch.testing.assert_close(out["rewards_chosen"], rc, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["rewards_rejected"], rr, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)


def test_trainable_parameters_move(tmp_path, tok):
    model = tiny_model("llama-reward")
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer = RewardTrainer(
        model=model, args=_config(tmp_path), train_dataset=_pairs(8), processing_class=tok
    )
    trainer.train()
    assert np.isfinite(trainer.state.log_history[-1]["train_loss"])
    logged = [h for h in trainer.state.log_history if "rewards/accuracies" in h]
    assert logged and {"rewards/chosen", "rewards/rejected", "rewards/margins"} <= set(logged[0])
    for name, p in model.named_parameters():
        if name in before:
            assert not torch.equal(p, before[name]), f"{name} did not move"


def test_pretokenised_dataset_and_keyword_override(tmp_path, tok):
    raw = _pairs(4)
    rows = []
    for r in raw:
        c, j = tok(r["prompt"] + r["chosen"]), tok(r["prompt"] + r["rejected"])
        rows.append(
            {
                "input_ids_chosen": c["input_ids"],
                "attention_mask_chosen": c["attention_mask"],
                "input_ids_rejected": j["input_ids"],
                "attention_mask_rejected": j["attention_mask"],
            }
        )
    longest = [max(len(r["input_ids_chosen"]), len(r["input_ids_rejected"])) for r in rows]
    limit = min(longest)
    n_long = sum(n > limit for n in longest)
    args = _config(tmp_path, max_length=512)
    trainer = RewardTrainer(
        model=tiny_model("llama-reward"),
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tok,
        max_length=limit,
    )
    assert (
        trainer.args.max_length == limit and args.max_length == 512
    )  # keyword wins; caller's config untouched
    assert trainer.overlong_counts["train_dataset"] == {"dropped": n_long, "truncated": 0}
    assert len(trainer.train_dataset) == 4 - n_long
    assert trainer.train_dataset[0]["chosen_ids"] in [r["input_ids_chosen"] for r in rows]


def test_bad_datasets_raise_clear_errors(tmp_path, tok):
    model = tiny_model("llama-reward")
    with pytest.raises(ValueError, match="needs the columns"):
        RewardTrainer(
            model=model,
            args=_config(tmp_path),
            processing_class=tok,
            train_dataset=datasets.Dataset.from_list([{"text": "x"}]),
        )
    with pytest.raises(ValueError, match="empty"):
        RewardTrainer(
            model=model, args=_config(tmp_path), processing_class=tok, train_dataset=_pairs(2).select([])
        )
    same = datasets.Dataset.from_list([{"chosen": "a b", "rejected": "a b"}] * 3)
    with pytest.raises(ValueError, match="identical"):
        RewardTrainer(model=model, args=_config(tmp_path), processing_class=tok, train_dataset=same)
    with pytest.raises(ValueError, match="overlong_policy"):
        _config(tmp_path, overlong_policy="cut")


def test_lora_reward_model_loads_as_reward_adapter(tmp_path, tok):
    """A LoRA (SEQ_CLS) run saves adapter + score head; a fresh base of the same weights reproduces scores."""
    from peft import LoraConfig, PeftModel

    peft_config = LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    trainer = RewardTrainer(
        model=tiny_model("llama-reward"),
        args=_config(tmp_path, max_steps=3),
        train_dataset=_pairs(8),
        processing_class=tok,
        peft_config=peft_config,
    )
    trainer.train()
    out = tmp_path / "adapter"
    trainer.save_model(str(out))
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    assert json.loads((out / "adapter_config.json").read_text())["task_type"] == "SEQ_CLS"
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert any("score" in k for k in keys), f"score head missing from the adapter: {keys}"
    assert any("lora_" in k for k in keys)

    fresh = tiny_model("llama-reward")
    torch.nn.init.normal_(fresh.score.weight)  # a different head: the adapter must bring its own
    loaded = PeftModel.from_pretrained(fresh, str(out)).eval()
    trained = trainer.model.eval()
    ids = torch.tensor(
        [tok("the movie was excellent")["input_ids"], tok("the movie was terrible")["input_ids"]]
    )
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, trained(input_ids=ids).logits)


def test_new_weights_of_a_path_and_lora_follow_the_config_seed(tmp_path, tok):
    """The score head a path's model gains and LoRA's A matrices come from args.seed, not from whatever
    drew random numbers before the trainer was built (the demo's reward adapter once depended on it)."""
    from peft import LoraConfig

    path = str(tiny_model_path("llama"))  # a causal LM: the sequence-classification head is new

    def initial_weights(draws: int, seed: int) -> dict[str, torch.Tensor]:
        torch.rand(draws)  # move the global generator
        trainer = RewardTrainer(
            model=path,
            args=_config(tmp_path, max_steps=1, seed=seed),
            train_dataset=_pairs(4),
            processing_class=tok,
            peft_config=LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["q_proj"]),
        )
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}

    first, second, other_seed = initial_weights(1, 0), initial_weights(1000, 0), initial_weights(1, 1)
    assert any("score" in n for n in first) and any("lora_A" in n for n in first)
    assert all(torch.equal(first[n], second[n]) for n in first)
    lora_a = next(n for n in first if "lora_A" in n)
    assert not torch.equal(first[lora_a], other_seed[lora_a])


@pytest.mark.slow
def test_accuracy_rises_on_separable_preferences(tmp_path, tok):
    model = tiny_model("llama-reward")
    args = _config(
        tmp_path, max_steps=40, per_device_train_batch_size=8, learning_rate=3e-3, logging_steps=10
    )
    trainer = RewardTrainer(
        model=model,
        args=args,
        train_dataset=_pairs(160, seed=1),
        eval_dataset=_pairs(48, seed=2),
        processing_class=tok,
    )
    before = trainer.evaluate()["eval_accuracy"]
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_accuracy"] >= 0.9, (before, after)
    assert after["eval_rewards/margins"] > 0
