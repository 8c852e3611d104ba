"""TRL 0.x's RewardTrainer, SFTTrainer and DPOTrainer, called as the seed documents them.

Each call uses the seed's signature (a plain `transformers.TrainingArguments` as `args`, `tokenizer=`,
the trainer-level keywords) with only the import changed from `trl` to `rlhfkit`; tiny local models
and small datasets built here stand in for hub names. The learning tests check that such a call
really trains: reward accuracy, SFT loss and the DPO reward margin all move the right way.
"""

from __future__ import annotations

import math
import random

import datasets
import pytest
import torch
from transformers import TrainingArguments

from rlhfkit import DPOTrainer, RewardTrainer, SFTTrainer
from rlhfkit.data.packing import ConstantLengthDataset
from rlhfkit.testing import tiny_model, tiny_model_path, tiny_tokenizer
from rlhfkit.testing.training_args import few_step_args
from rlhfkit.trainers.dpo.config import DPOConfig
from rlhfkit.trainers.reward_model.config import RewardConfig
from rlhfkit.trainers.sft.config import SFTConfig

WORDS = ["the", "movie", "was", "plot", "actors", "music", "really", "quite", "story", "film"]
DOCS = [
    "the cat sat on the mat",
    "a dog ran far away today",
    "hello there friend of mine",
    "rain falls on the quiet town",
    "we like to read long books at night",
    "birds sing in the morning",
]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(padding_side="right")


def _training_args(tmp_path, **kw):
    """A plain transformers.TrainingArguments, as seed 001 types `args`."""
    return few_step_args(TrainingArguments, tmp_path / "out", **{"per_device_eval_batch_size": 16, **kw})


def _reward_pairs(n, seed=0):
    """Text pairs where the chosen side says 'excellent' and the rejected side 'terrible'."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        prompt, tail = " ".join(rng.choices(WORDS, k=3)), " ".join(rng.choices(WORDS, k=2))
        rows.append({"prompt": prompt + " ", "chosen": f"excellent {tail}", "rejected": f"terrible {tail}"})
    return datasets.Dataset.from_list(rows)


def _reward_tokenised(tokenizer, n, seed=0):
    """TRL 0.x's documented reward format: the four tokenised columns, built by the caller."""
    rows = []
    for row in _reward_pairs(n, seed):
        chosen = tokenizer(row["prompt"] + row["chosen"])
        rejected = tokenizer(row["prompt"] + row["rejected"])
        rows.append(
            {
                "input_ids_chosen": chosen["input_ids"],
                "attention_mask_chosen": chosen["attention_mask"],
                "input_ids_rejected": rejected["input_ids"],
                "attention_mask_rejected": rejected["attention_mask"],
            }
        )
    return datasets.Dataset.from_list(rows)


def _dpo_pairs(n, seed=0):
    rng = random.Random(seed)
    return datasets.Dataset.from_list(
        [
            {"prompt": " ".join(rng.choices(WORDS, k=3)) + ": ", "chosen": "yes good", "rejected": "no bad"}
            for _ in range(n)
        ]
    )


# --- tokenizer= and a plain TrainingArguments -----------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda tmp, tok, **kw: RewardTrainer(
            model=tiny_model("llama-reward"), args=_training_args(tmp), train_dataset=_reward_pairs(4), **kw
        ),
        lambda tmp, tok, **kw: SFTTrainer(
            model=tiny_model("llama"),
            args=_training_args(tmp),
            train_dataset=datasets.Dataset.from_list([{"text": d} for d in DOCS]),
            **kw,
        ),
        lambda tmp, tok, **kw: DPOTrainer(
            model=tiny_model("llama"), args=_training_args(tmp), train_dataset=_dpo_pairs(4), **kw
        ),
    ],
    ids=["reward", "sft", "dpo"],
)
def test_tokenizer_keyword_is_processing_class(tmp_path, tok, make):
    trainer = make(tmp_path, tok, tokenizer=tok)
    assert trainer.processing_class is tok
    assert make(tmp_path, tok, tokenizer=tok, processing_class=tok).processing_class is tok  # same object
    other = tiny_tokenizer(padding_side="right")
    with pytest.raises(ValueError, match="`tokenizer` and `processing_class`"):
        make(tmp_path, tok, tokenizer=tok, processing_class=other)


@pytest.mark.parametrize(
    "trainer_cls, config_cls, model_name, dataset",
    [
        (RewardTrainer, RewardConfig, "llama-reward", _reward_pairs(4)),
        (SFTTrainer, SFTConfig, "llama", datasets.Dataset.from_list([{"text": d} for d in DOCS])),
        (DPOTrainer, DPOConfig, "llama", _dpo_pairs(4)),
    ],
    ids=["reward", "sft", "dpo"],
)
def test_plain_training_arguments_train_and_evaluate(
    tmp_path, tok, trainer_cls, config_cls, model_name, dataset
):
    """Before the fix remove_unused_columns stayed True and Trainer dropped every pair column."""
    args = _training_args(tmp_path, learning_rate=2e-3, warmup_steps=1, eval_strategy="no")
    before = args.to_dict()
    trainer = trainer_cls(
        model=tiny_model(model_name), args=args, train_dataset=dataset, eval_dataset=dataset, tokenizer=tok
    )
    assert isinstance(trainer.args, config_cls) and trainer.args.remove_unused_columns is False
    assert trainer.args.learning_rate == 2e-3 and trainer.args.warmup_steps == 1  # the caller's values kept
    trainer.train()
    assert math.isfinite(trainer.evaluate()["eval_loss"])
    assert args.to_dict() == before and args.remove_unused_columns is True  # the caller's object untouched


def test_plain_training_arguments_explicit_remove_unused_columns_is_kept(tmp_path, tok):
    args = _training_args(tmp_path, remove_unused_columns=False)
    trainer = RewardTrainer(model=tiny_model("llama-reward"), args=args, tokenizer=tok)
    assert trainer.args.remove_unused_columns is False


# --- RewardTrainer -------------------------------------------------------------------------------


def test_reward_custom_collator_gets_the_documented_tokenised_columns(tmp_path, tok):
    """TRL 0.x: without the default collator, the dataset carries input_ids_chosen / attention_mask_chosen /
    input_ids_rejected / attention_mask_rejected, and the caller's collator reads exactly those."""
    seen = []

    def collator(rows):
        seen.append(sorted(rows[0]))
        pad = tok.pad_token_id
        out = {}
        for key in (
            "input_ids_chosen",
            "attention_mask_chosen",
            "input_ids_rejected",
            "attention_mask_rejected",
        ):
            width = max(len(r[key]) for r in rows)
            fill = 0 if key.startswith("attention") else pad
            out[key] = torch.tensor([r[key] + [fill] * (width - len(r[key])) for r in rows])
        return out

    args = _training_args(tmp_path, max_steps=1)
    trainer = RewardTrainer(
        model=tiny_model("llama-reward"),
        args=args,
        data_collator=collator,
        train_dataset=_reward_tokenised(tok, 4),
        tokenizer=tok,
    )
    trainer.train()
    assert seen[0] == [
        "attention_mask_chosen",
        "attention_mask_rejected",
        "input_ids_chosen",
        "input_ids_rejected",
    ]


def test_reward_max_length_keyword_drops_overlong_pairs(tmp_path, tok):
    data = _reward_tokenised(tok, 8)
    lengths = [max(len(c), len(r)) for c, r in zip(data["input_ids_chosen"], data["input_ids_rejected"])]
    limit = sorted(lengths)[len(lengths) // 2]
    trainer = RewardTrainer(
        model=tiny_model("llama-reward"),
        args=_training_args(tmp_path),
        train_dataset=data,
        tokenizer=tok,
        max_length=limit,
    )
    assert trainer.args.max_length == limit
    assert len(trainer.train_dataset) == sum(n <= limit for n in lengths) < len(data)
    assert trainer.overlong_counts["train_dataset"]["dropped"] == sum(n > limit for n in lengths)


def test_reward_model_learns_from_seed_format(tmp_path, tok):
    """TRL 0.x's call: RewardTrainer(model, args=TrainingArguments, tokenizer=, max_length=) on the four
    tokenised columns with the default RewardDataCollatorWithPadding."""
    args = _training_args(
        tmp_path, max_steps=40, per_device_train_batch_size=8, learning_rate=3e-3, logging_steps=10
    )
    trainer = RewardTrainer(
        model=tiny_model("llama-reward"),
        args=args,
        train_dataset=_reward_tokenised(tok, 160, seed=1),
        eval_dataset=_reward_tokenised(tok, 48, seed=2),
        tokenizer=tok,
        max_length=64,
    )
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_accuracy"] >= 0.9, (before, after)
    assert after["eval_rewards/margins"] > before["eval_rewards/margins"] + 1.0, (before, after)


# --- SFTTrainer ----------------------------------------------------------------------------------


def test_sft_keywords_reach_the_packed_dataset(tmp_path, tok):
    rows = datasets.Dataset.from_list([{"content": d} for d in DOCS])
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_training_args(tmp_path, max_steps=1),
        train_dataset=rows,
        tokenizer=tok,
        dataset_text_field="content",
        packing=True,
        max_seq_length=8,
        infinite=True,
        num_of_sequences=3,
        chars_per_token=2.0,
    )
    packed = trainer.train_dataset
    assert isinstance(packed, ConstantLengthDataset)
    assert packed.dataset_text_field == "content" and packed.infinite
    assert packed.seq_length == 8 and packed.max_buffer_chars == int(8 * 2.0 * 3)
    block = next(iter(packed))
    assert block["input_ids"].shape == (8,)
    trainer.train()


def test_sft_formatting_func_and_max_seq_length_shape_unpacked_rows(tmp_path, tok):
    rows = datasets.Dataset.from_list([{"q": d, "a": d[::-1]} for d in DOCS])
    trainer = SFTTrainer(
        model=tiny_model("llama"),
        args=_training_args(tmp_path),
        train_dataset=rows,
        tokenizer=tok,
        formatting_func=lambda row: f"Question: {row['q']} Answer: {row['a']}",
        max_seq_length=6,
        dataset_num_proc=None,
        dataset_batch_size=2,
    )
    assert trainer.args.dataset_batch_size == 2
    first = trainer.train_dataset[0]["input_ids"]
    assert len(first) == 6  # truncated by max_seq_length
    assert first == tok("Question: " + DOCS[0] + " Answer: " + DOCS[0][::-1])["input_ids"][:6]
    trainer.train()


def test_packed_sft_model_learns(tmp_path):
    """TRL 0.x's call with a model path: SFTTrainer(path, args=TrainingArguments, tokenizer=,
    dataset_text_field=, packing=True, max_seq_length=)."""
    tokenizer = tiny_tokenizer(padding_side="right")
    text = datasets.Dataset.from_list([{"text": d} for d in DOCS * 4])
    trainer = SFTTrainer(
        str(tiny_model_path("llama")),
        args=_training_args(tmp_path, max_steps=30, learning_rate=3e-3, per_device_train_batch_size=4),
        train_dataset=text,
        eval_dataset=text,
        tokenizer=tokenizer,
        dataset_text_field="text",
        packing=True,
        max_seq_length=16,
    )
    assert trainer.train_dataset.column_names == ["input_ids", "position_ids", "labels"]
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert after < 0.6 * before, (before, after)


# --- DPOTrainer ----------------------------------------------------------------------------------


def test_dpo_keywords_override_the_config(tmp_path, tok):
    trainer = DPOTrainer(
        tiny_model("llama"),
        None,  # ref_model: a frozen copy of the policy
        0.25,  # beta, third positional as in TRL 0.x
        args=_training_args(tmp_path),
        label_pad_token_id=-7,
        padding_value=3,
        truncation_mode="keep_start",
        train_dataset=_dpo_pairs(4),
        tokenizer=tok,
        max_length=9,
        max_prompt_length=4,
    )
    assert (trainer.beta, trainer.args.beta) == (0.25, 0.25)
    # beta scales the implicit rewards: 0.25 * (log pi - log ref)
    zero = torch.zeros(1)
    _, chosen_reward, _ = trainer.dpo_loss(torch.tensor([-1.0]), zero, torch.tensor([-3.0]), zero)
    assert chosen_reward.item() == pytest.approx(0.5)
    long_prompt = "the movie was really quite the story of the film: "
    row = trainer._prepare(
        datasets.Dataset.from_list([{"prompt": long_prompt, "chosen": "yes good", "rejected": "no"}]),
        tok,
        trainer.args,
        "train_dataset",
    )[0]
    prompt_ids = tok(long_prompt)["input_ids"]
    assert row["prompt_ids"] == prompt_ids[:4]  # keep_start, max_prompt_length
    assert len(row["prompt_ids"]) + len(row["chosen_ids"]) <= 9  # max_length
    batch = trainer.data_collator([row, {**row, "rejected_ids": row["rejected_ids"] + [5, 6]}])
    assert batch["rejected_input_ids"][0, -2:].tolist() == [3, 3]  # padding_value pads input ids
    assert batch["chosen_labels"][0, 0].item() == -7  # label_pad_token_id marks the prompt


def test_dpo_disable_dropout_keyword(tmp_path, tok):
    def dropout_ps(trainer):
        return {m.p for m in trainer.model.modules() if isinstance(m, torch.nn.Dropout)}

    def build(**kw):
        model = tiny_model("gpt2", resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.2)
        args = _training_args(tmp_path)
        return DPOTrainer(model, args=args, train_dataset=_dpo_pairs(4), tokenizer=tok, **kw)

    assert dropout_ps(build()) == {0.0}  # seed default disable_dropout=True
    assert dropout_ps(build(disable_dropout=False)) == {0.2}


def test_dpo_methods_return_seed_forms(tmp_path, tok):
    trainer = DPOTrainer(
        tiny_model("llama"), args=_training_args(tmp_path), train_dataset=_dpo_pairs(4), tokenizer=tok
    )
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(3)]))
    concatenated = trainer.concatenated_inputs(batch)
    assert concatenated["concatenated_input_ids"].shape[0] == 6  # chosen rows, then rejected rows
    chosen_logps, rejected_logps, chosen_logits, rejected_logits = trainer.concatenated_forward(
        trainer.model, batch
    )
    assert chosen_logps.shape == rejected_logps.shape == (3,)
    vocab = trainer.model.config.vocab_size
    assert chosen_logits.dim() == 3 and chosen_logits.shape[0] == 3 and chosen_logits.shape[2] == vocab
    assert rejected_logits.shape == chosen_logits.shape
    losses, chosen_rewards, rejected_rewards = trainer.dpo_loss(
        chosen_logps, rejected_logps, chosen_logps.detach(), rejected_logps.detach()
    )
    assert losses.shape == (3,) and torch.allclose(losses, torch.full((3,), math.log(2)))  # policy == ref
    out = trainer.get_batch_metrics(trainer.model, batch, train_eval="eval")
    assert len(out) == 2
    loss, metrics = out
    assert loss.dim() == 0 and loss.item() == pytest.approx(math.log(2), abs=1e-5)
    assert {"eval_rewards/accuracies", "eval_rewards/margins", "eval_logits/chosen"} <= set(metrics)
    assert all(isinstance(v, float) for v in metrics.values())
    assert "rewards/chosen" in trainer.get_batch_metrics(trainer.model, batch)[1]  # train_eval="train"
    policy_texts, reference_texts = trainer.get_batch_samples(trainer.model, batch)
    assert len(policy_texts) == len(reference_texts) == 3


def test_dpo_evaluate_predictions_are_implicit_rewards(tmp_path, tok):
    seen = {}

    def compute_metrics(pred):
        seen["shape"] = pred.predictions.shape
        return {"pairs": float(pred.predictions.shape[0])}

    trainer = DPOTrainer(
        tiny_model("llama"),
        args=_training_args(tmp_path),
        train_dataset=_dpo_pairs(4),
        eval_dataset=_dpo_pairs(5),
        tokenizer=tok,
        compute_metrics=compute_metrics,
    )
    out = trainer.evaluate()
    assert seen["shape"] == (5, 2) and out["eval_pairs"] == 5.0


def test_dpo_model_learns_with_plain_training_arguments(tmp_path, tok):
    """TRL 0.x's call: DPOTrainer(model, ref_model=None, beta=, args=TrainingArguments, tokenizer=,
    max_length=, max_prompt_length=)."""
    trainer = DPOTrainer(
        tiny_model("llama"),
        ref_model=None,
        beta=0.1,
        args=_training_args(tmp_path, max_steps=12, per_device_train_batch_size=8, learning_rate=2e-3),
        train_dataset=_dpo_pairs(96, seed=1),
        eval_dataset=_dpo_pairs(32, seed=2),
        tokenizer=tok,
        max_length=64,
        max_prompt_length=32,
    )
    before = trainer.evaluate()
    assert before["eval_rewards/margins"] == 0.0  # policy == reference
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_rewards/accuracies"] >= 0.9, after
    assert after["eval_rewards/margins"] > 0 and after["eval_loss"] < math.log(2)


def test_dpo_model_init_needs_a_reference(tmp_path, tok):
    def build(**kw):
        return DPOTrainer(
            model_init=lambda *_: tiny_model("llama"),
            args=_training_args(tmp_path),
            train_dataset=_dpo_pairs(4),
            tokenizer=tok,
            **kw,
        )

    with pytest.raises(ValueError, match="`model_init` and no `model`, pass `ref_model`"):
        build()
    build(ref_model=tiny_model("llama")).train()


def test_dpo_training_calls_an_overridden_get_batch_metrics(tmp_path, tok):
    """TRL 0.7 code subclasses DPOTrainer and overrides get_batch_metrics; training must use it."""

    class Tagged(DPOTrainer):
        def get_batch_metrics(self, model, batch, train_eval="train"):
            loss, metrics = super().get_batch_metrics(model, batch, train_eval)
            return loss, {**metrics, "custom/pairs": float(batch["chosen_input_ids"].shape[0])}

    args = _training_args(tmp_path, max_steps=1)
    trainer = Tagged(tiny_model("llama"), args=args, train_dataset=_dpo_pairs(4), tokenizer=tok)
    trainer.train()
    assert [h["custom/pairs"] for h in trainer.state.log_history if "custom/pairs" in h] == [4.0]
