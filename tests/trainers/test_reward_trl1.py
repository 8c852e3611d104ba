"""RewardTrainer's TRL 1.x forms: pre-tokenised chosen_ids/rejected_ids, DataCollatorForPreference batches,
pad_token / eos_token / pad_to_multiple_of, and a tokenizer without a pad token padding with its eos."""

from __future__ import annotations

import datasets
import pytest
import torch

from rlhfkit.data.collators import DataCollatorForPreference
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.testing.training_args import few_step_args
from rlhfkit.trainers.reward_model.config import RewardConfig
from rlhfkit.trainers.reward_model.trainer import RewardTrainer


def _config(tmp_path, **kw):
    return few_step_args(RewardConfig, tmp_path / "out", **kw)


def _pairs(n):
    rows = [{"prompt": f"the film {i} ", "chosen": "was excellent fun", "rejected": "bad"} for i in range(n)]
    return datasets.Dataset.from_list(rows)


def _scores_alone(model, trainer, i):
    """Each side scored on its own, no padding: what a padded batch must reproduce."""
    row = trainer.train_dataset[i]
    with torch.no_grad():
        return [model(input_ids=torch.tensor([row[f"{s}_ids"]])).logits[0, 0] for s in ("chosen", "rejected")]


def test_trl1_collator_batch_scores_like_the_default(tmp_path):
    tok = tiny_tokenizer(padding_side="right")
    model = tiny_model("llama-reward").eval()
    trainer = RewardTrainer(
        model=model, args=_config(tmp_path), train_dataset=_pairs(4), processing_class=tok
    )
    rows = [trainer.train_dataset[i] for i in range(4)]
    batch = DataCollatorForPreference(pad_token_id=tok.pad_token_id)(rows)  # the prepared rows as they are
    with torch.no_grad():
        chosen, rejected = trainer.score_pairs(model, batch)
        default = trainer.score_pairs(model, trainer.data_collator(rows))
    torch.testing.assert_close(chosen, default[0])
    torch.testing.assert_close(rejected, default[1])
    alone = torch.tensor(_scores_alone(model, trainer, 1))
    torch.testing.assert_close(torch.stack([chosen[1], rejected[1]]), alone, atol=1e-5, rtol=1e-5)


def test_tokenizer_without_pad_token_pads_with_eos(tmp_path):
    tok = tiny_tokenizer(padding_side="right")
    tok.pad_token = None
    model = tiny_model("llama-reward").eval()
    model.config.pad_token_id = None
    trainer = RewardTrainer(
        model=model, args=_config(tmp_path), train_dataset=_pairs(4), processing_class=tok
    )
    assert tok.pad_token == tok.eos_token and model.config.pad_token_id == tok.eos_token_id
    rows = [trainer.train_dataset[i] for i in range(2)]
    with torch.no_grad():
        chosen, rejected = trainer.score_pairs(model, trainer.data_collator(rows))
    # row 1's rejected side is padded with eos; the score still comes from its last real token
    torch.testing.assert_close(rejected[1], _scores_alone(model, trainer, 1)[1], atol=1e-5, rtol=1e-5)
    assert trainer.train().training_loss > 0


def test_pad_token_eos_token_and_pad_to_multiple_of(tmp_path):
    tok = tiny_tokenizer(padding_side="right")
    model = tiny_model("llama-reward")
    args = _config(tmp_path, pad_token="<|assistant|>", eos_token="<|pad|>", pad_to_multiple_of=16)
    trainer = RewardTrainer(model=model, args=args, train_dataset=_pairs(4), processing_class=tok)
    assert (tok.pad_token, tok.eos_token) == ("<|assistant|>", "<|pad|>")
    assert model.config.pad_token_id == 4 and model.config.eos_token_id == 1
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    assert batch["input_ids_chosen"].shape[1] == 16 and int(batch["input_ids_rejected"][0, -1]) == 4
    with pytest.raises(ValueError, match="eos_token='<nope>' is not in the tokenizer's vocabulary"):
        RewardTrainer(
            model=tiny_model("llama-reward"),
            args=_config(tmp_path, eos_token="<nope>"),
            train_dataset=_pairs(4),
            processing_class=tiny_tokenizer(padding_side="right"),
        )


def test_pretokenised_chosen_ids_train(tmp_path):
    tok = tiny_tokenizer(padding_side="right")
    rows = [{"chosen_ids": [5 + i, 20, 21, 22], "rejected_ids": [5 + i, 30]} for i in range(8)]
    model = tiny_model("llama-reward")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = RewardTrainer(
        model=model,
        args=_config(tmp_path),
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tok,
    )
    assert trainer.train_dataset[0]["chosen_ids"] == [5, 20, 21, 22]  # the given ids, not re-tokenised
    trainer.train()
    assert all(not torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_iterable_dataset_trains_and_drops_overlong_pairs_lazily(tmp_path):
    tok = tiny_tokenizer(padding_side="right")
    rows = [{"chosen": "was excellent fun " * 20, "rejected": "bad"}] + _pairs(8).to_list()
    model = tiny_model("llama-reward")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = RewardTrainer(
        model=model,
        args=_config(tmp_path, max_length=32, dataset_num_proc=2),
        train_dataset=datasets.Dataset.from_list(rows).to_iterable_dataset(),
        processing_class=tok,
    )
    kept = list(trainer.train_dataset)
    assert len(kept) == 8 and all(len(r["chosen_ids"]) <= 32 for r in kept)  # the long pair is gone
    assert trainer.overlong_counts["train_dataset"] == {"dropped": None, "truncated": None}  # not counted
    trainer.train()
    assert all(not torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_a_model_with_more_than_one_label_is_refused(tmp_path):
    tok = tiny_tokenizer(padding_side="right")
    with pytest.raises(ValueError, match=r"`model` must output one score .* has num_labels=2"):
        RewardTrainer(
            model=tiny_model("llama-reward", num_labels=2, ignore_mismatched_sizes=True),
            args=_config(tmp_path),
            train_dataset=_pairs(4),
            processing_class=tok,
        )
