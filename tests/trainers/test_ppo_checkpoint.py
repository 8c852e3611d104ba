"""Checkpoint and resume: a resumed run continues with exactly the numbers of an uninterrupted one."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from rlhfkit import PPOConfig, PPOTrainer
from rlhfkit.testing import tiny_tokenizer, tiny_value_head_model
from rlhfkit.trainers.common.checkpointing import LOCK_FILE, load_state


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def base_model():
    # value-head dropout on: the resumed run must also replay the dropout masks (RNG state)
    return tiny_value_head_model("llama", summary_dropout_prob=0.1)


QUERY_TEXTS = ["the film was", "a story about", "we saw it", "the cast"]


def new_trainer(base_model, tokenizer):
    config = PPOConfig(
        batch_size=4,
        mini_batch_size=2,
        ppo_epochs=2,
        learning_rate=1e-3,
        seed=7,
        init_kl_coef=0.5,
        target=0.01,
        horizon=10,
        use_score_scaling=True,
        use_score_norm=True,
    )
    model = copy.deepcopy(base_model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    return PPOTrainer(config, model, tokenizer=tokenizer, optimizer=optimizer, lr_scheduler=scheduler)


def run_steps(trainer, tokenizer, n):
    """The seed loop: sample (RNG), score, step. Returns the stats of each step."""
    queries = [torch.tensor(tokenizer.encode(t)) for t in QUERY_TEXTS]
    history = []
    for _ in range(n):
        responses = trainer.generate(queries, return_prompt=False, max_new_tokens=5, do_sample=True)
        scores = [torch.tensor(float(len(r)) + float(r.float().mean()) / 100) for r in responses]
        history.append(trainer.step(queries, responses, scores))
    return history


KEYS = [
    "objective/kl",
    "objective/kl_coef",
    "ppo/loss/total",
    "ppo/mean_scores",
    "ppo/mean_scores_scaled",
    "ppo/val/vpred",
    "ppo/learning_rate",
    "tokens/responses_len_mean",
]


def test_resumed_run_matches_uninterrupted_run(base_model, tokenizer, tmp_path):
    uninterrupted = new_trainer(base_model, tokenizer)
    full_history = run_steps(uninterrupted, tokenizer, 4)

    first = new_trainer(base_model, tokenizer)
    run_steps(first, tokenizer, 2)
    first.save_checkpoint(str(tmp_path / "ckpt"))
    run_steps(first, tokenizer, 1)  # the original run goes on; the checkpoint must not change
    del first

    resumed = new_trainer(base_model, tokenizer)  # fresh weights, fresh seed ...
    resumed.load_checkpoint(str(tmp_path / "ckpt"))  # ... until the checkpoint is loaded
    assert resumed.current_step == 2
    resumed_history = run_steps(resumed, tokenizer, 2)

    for expected, got in zip(full_history[2:], resumed_history):
        for key in KEYS:
            assert got[key] == expected[key], key
    assert resumed.kl_ctl.value == uninterrupted.kl_ctl.value
    assert resumed.running.state_dict() == uninterrupted.running.state_dict()
    assert resumed.health.state_dict() == uninterrupted.health.state_dict()  # the alarms' history came back
    assert [step for step, _ in resumed.health.state_dict()["series"]["kl"]["first"]] == [1, 2, 3, 4]
    for (name, p), (_, q) in zip(
        uninterrupted.policy.state_dict().items(), resumed.policy.state_dict().items()
    ):
        assert torch.equal(p, q), name
    assert resumed.current_step == uninterrupted.current_step == 4


def test_checkpoint_folder_is_replaced_atomically_and_validated(base_model, tokenizer, tmp_path):
    trainer = new_trainer(base_model, tokenizer)
    target = tmp_path / "ckpt"
    trainer.save_checkpoint(str(target))
    run_steps(trainer, tokenizer, 1)
    trainer.save_checkpoint(str(target))  # overwriting an existing checkpoint
    assert sorted(p.name for p in target.iterdir()) == [
        "manifest.json",
        "model.safetensors",
        "trainer_state.json",
        "trainer_state.safetensors",
        "training_settings.json",
    ]
    settings = json.loads((target / "training_settings.json").read_text())
    assert settings["batch_size"] == trainer.config.batch_size and settings["steps"] == trainer.config.steps
    assert settings["learning_rate"] == trainer.config.learning_rate
    assert not [
        p for p in tmp_path.iterdir() if p.name.startswith(".") and p.name != LOCK_FILE
    ]  # no temp folders
    state = load_state(target, "trainer_state")
    assert state["step"] == 1 and set(state) >= {"optimizer", "kl_ctl", "running", "rng", "lr_scheduler"}
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.json").write_text("{}")
    with pytest.raises(ValueError, match="other' has no manifest.json"):  # CheckpointError
        trainer.load_checkpoint(str(tmp_path / "other"))
    with pytest.warns(UserWarning), pytest.raises(FileNotFoundError, match="not an rlhfkit checkpoint"):
        trainer.load_checkpoint(str(tmp_path / "other"), trust_unverified_checkpoint=True)


def test_lora_policy_checkpoint_round_trip(tokenizer, tmp_path):
    from peft import LoraConfig, TaskType

    lora = LoraConfig(
        task_type=TaskType.CAUSAL_LM, r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]
    )

    def lora_trainer():
        model = tiny_value_head_model("llama", peft_config=lora)
        return PPOTrainer(
            PPOConfig(batch_size=4, mini_batch_size=2, ppo_epochs=1, learning_rate=1e-2),
            model,
            tokenizer=tokenizer,
        )

    trainer = lora_trainer()
    run_steps(trainer, tokenizer, 1)
    trainer.save_checkpoint(str(tmp_path / "ckpt"))
    restored = lora_trainer()
    restored.load_checkpoint(str(tmp_path / "ckpt"))
    for (name, p), (_, q) in zip(trainer.policy.state_dict().items(), restored.policy.state_dict().items()):
        assert torch.equal(p, q), name
    assert restored.optimizer.state_dict()["state"].keys() == trainer.optimizer.state_dict()["state"].keys()
