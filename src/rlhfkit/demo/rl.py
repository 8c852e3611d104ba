"""The RL stage: the SFT policy is optimised against the *learned* reward model (never the gold judge).

One function per `--algo`, chosen from `RL_ALGOS`. Each saves a plain causal LM (LoRA merged) into
its folder, so evaluation loads every algorithm the same way, and writes `curves.json`: per update,
the learned-reward score of the samples and their KL to the SFT policy (DPO: implicit rewards).

Every algorithm also runs `WinRateCallback` (`--curve_points` times over the stage): the policy against
the SFT policy on `--curve_num_prompts` held-out prompts, judged by the gold judge; its points go into
`curves.json` under "win_rate" (step, rate and the 95% interval's ends).
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlhfkit.demo.cache import StageResult
from rlhfkit.demo.config import PPO_MINI_BATCHES, DemoConfig
from rlhfkit.demo.stages import (
    adapter_lora,
    cosine_schedule,
    load_pairs,
    load_reward_model,
    load_tokenizer,
    online_rl_defaults,
    trainer_defaults,
)


def _write_curves(out: Path, curves: dict[str, list[float]], history: list[dict[str, Any]]) -> None:
    shutil.rmtree(out / "trainer", ignore_errors=True)  # the trainers' scratch folder (no checkpoints kept)
    (out / "curves.json").write_text(json.dumps(curves, indent=1), encoding="utf-8")
    (out / "log_history.json").write_text(json.dumps(history, indent=1, default=float), encoding="utf-8")


def win_rate_callback(cfg: DemoConfig, tokenizer, total_steps: int, out: Path, trainer=None, reference=None):
    """The win-rate curve's callback (gold judge, SFT reference, sampling as in evaluation); None when
    `--curve_points 0`. Evaluates every `total_steps // curve_points` steps."""
    if not cfg.curve_points:
        return None
    from rlhfkit.judges import RuleJudge
    from rlhfkit.rewards import SentimentJudge
    from rlhfkit.rollout import SamplingParams
    from rlhfkit.tasks import review_prompts
    from rlhfkit.trainers.common.win_rate import WinRateCallback

    vader = SentimentJudge()
    # the gold judge reads the whole review, as in the evaluation stage
    judge = RuleJudge(lambda prompts, completions: vader([p + c for p, c in zip(prompts, completions)]))
    params = SamplingParams(
        cfg.response_length,
        temperature=cfg.temperature,
        top_k=0,
        top_p=1.0,
        stop_token_ids=None if tokenizer.eos_token_id is None else (tokenizer.eos_token_id,),
    )
    prompts = review_prompts("test", n=cfg.curve_num_prompts, seed=cfg.seed + 2000)
    return WinRateCallback(
        judge,
        prompts,
        trainer=trainer,
        every_n_steps=max(1, total_steps // cfg.curve_points),
        reference_model=reference,
        sampling_params=params,
        tokenizer=tokenizer,
        batch_size=64,
        seed=cfg.seed,
        output_dir=str(out),
    )


def _train_and_save(trainer, tokenizer, out: Path, callback) -> Any:
    """Train a Trainer-style RL stage (with the win-rate curve's callback, if any), then save the policy."""
    if callback is not None:
        trainer.add_callback(callback)
    result = trainer.train()
    trainer.model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return result


def _win_rate_points(history: list[dict[str, Any]]) -> dict[str, list[float]]:
    """The logged `eval/win_rate` points: step, rate and the ends of its 95% interval."""
    logged = [h for h in history if "eval/win_rate" in h]
    return {
        "step": [int(h["step"]) for h in logged],
        "rate": [h["eval/win_rate"] for h in logged],
        "low": [h["eval/win_rate_low"] for h in logged],
        "high": [h["eval/win_rate_high"] for h in logged],
    }


def _train_prompts(cfg: DemoConfig):
    from rlhfkit.tasks import review_prompt_dataset

    return review_prompt_dataset("train", seed=cfg.seed).select_columns(["prompt"])


def _summary(curves: dict[str, list[float]], updates: int) -> dict[str, Any]:
    """Start and end of the curves, each a mean over a few logged points (one update is noisy)."""

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    def window(key: str) -> tuple[list[float], list[float]]:
        values = [v for v in curves.get(key) or [] if v is not None]
        k = max(1, min(5, len(values) // 3))
        return values[:k], values[-k:]

    (reward_head, reward_tail), (_, kl_tail) = window("reward"), window("kl")
    summary = {
        "updates": updates,
        "reward_start": mean(reward_head),
        "reward_end": mean(reward_tail),
        "kl_end": mean(kl_tail),
    }
    points = curves.get("win_rate") or {}
    if points.get("step"):  # the curve's last point (the full curve is in curves.json)
        summary.update(curve_step_end=points["step"][-1], curve_win_rate_end=points["rate"][-1])
    return summary


# ---------------------------------------------------------------------- RLOO
def train_rloo(cfg: DemoConfig, sft: StageResult, reward: StageResult, preferences: StageResult, out: Path):
    from transformers import AutoModelForCausalLM

    from rlhfkit.trainers.rloo.config import RLOOConfig
    from rlhfkit.trainers.rloo.trainer import RLOOTrainer

    tokenizer = load_tokenizer(sft.path)
    mini_batches = 2 if cfg.rl_batch_size % (2 * cfg.rloo_k) == 0 else 1
    args = RLOOConfig(
        per_device_train_batch_size=cfg.rl_batch_size // mini_batches,
        num_mini_batches=mini_batches,
        gradient_accumulation_steps=1,
        rloo_k=cfg.rloo_k,
        total_episodes=cfg.rl_updates * cfg.rl_batch_size,
        num_ppo_epochs=cfg.rl_epochs,
        kl_coef=cfg.kl_coef,
        response_length=cfg.response_length,
        stop_token="eos",
        local_rollout_forward_batch_size=64,
        num_sample_generations=0,
        logging_steps=max(1, cfg.rl_updates // 20),
        logging_first_step=True,
        sft_model_path=str(sft.path),
        reward_model_path=str(reward.path),
        **online_rl_defaults(cfg, out),
    )
    policy = AutoModelForCausalLM.from_pretrained(sft.path, dtype=torch.float32)
    ref_policy = AutoModelForCausalLM.from_pretrained(sft.path, dtype=torch.float32)
    trainer = RLOOTrainer(
        args,
        tokenizer,
        policy,
        ref_policy,
        load_reward_model(sft, reward),
        _train_prompts(cfg),
    )
    callback = win_rate_callback(cfg, tokenizer, cfg.rl_updates, out, trainer=trainer, reference=ref_policy)
    result = _train_and_save(trainer, tokenizer, out, callback)
    history = [h for h in trainer.state.log_history if "objective/scores" in h]
    curves = {
        "step": [h.get("step", i + 1) for i, h in enumerate(history)],
        "reward": [h["objective/scores"] for h in history],
        "kl": [h["objective/kl"] for h in history],
        "win_rate": _win_rate_points(trainer.state.log_history),
    }
    _write_curves(out, curves, trainer.state.log_history)
    return _summary(curves, result.global_step)


# ---------------------------------------------------------------------- PPO (classic generate/step loop)
def _ppo_loop(cfg: DemoConfig, trainer, tokenizer, scorer, out: Path) -> dict[str, Any]:
    """`rl_updates` rounds of generate -> score with the learned reward -> `step()`."""
    from rich.progress import Progress

    prompts = _train_prompts(cfg)["prompt"]
    generator = torch.Generator().manual_seed(cfg.seed)
    # the classic loop samples from the policy as it is (temperature 1): step() scores logprobs at T=1
    gen_kwargs = dict(max_new_tokens=cfg.response_length, do_sample=True, top_k=0, top_p=1.0)
    curves: dict[str, Any] = {"step": [], "reward": [], "kl": []}
    history = []
    callback = win_rate_callback(cfg, tokenizer, cfg.rl_updates, out, trainer=trainer)
    with Progress() as progress:
        task = progress.add_task("PPO updates", total=cfg.rl_updates)
        for update in range(cfg.rl_updates):
            rows = torch.randperm(len(prompts), generator=generator)[: cfg.rl_batch_size].tolist()
            queries = [
                torch.tensor(tokenizer(prompts[i], add_special_tokens=False)["input_ids"]) for i in rows
            ]
            responses = trainer.generate(queries, batch_size=64, return_prompt=False, **gen_kwargs)
            scores = scorer.score_responses(queries, responses)[0].cpu()
            stats = trainer.step(queries, responses, list(scores))
            if callback is not None:
                stats.update(callback.on_ppo_step(trainer, step=update + 1), step=update + 1)
            curves["step"].append(update + 1)
            curves["reward"].append(float(scores.mean()))
            curves["kl"].append(float(stats["objective/kl"]))
            history.append({k: float(v) for k, v in stats.items() if isinstance(v, int | float)})
            progress.update(
                task,
                advance=1,
                description=(f"PPO updates  score={curves['reward'][-1]:.3f}  kl={curves['kl'][-1]:.3f}"),
            )
    curves["win_rate"] = _win_rate_points(history)
    _write_curves(out, curves, history)
    return _summary(curves, cfg.rl_updates)


def _ppo_config(cfg: DemoConfig, learning_rate: float):
    from rlhfkit.trainers.ppo import PPOConfig

    return PPOConfig(
        learning_rate=learning_rate,
        batch_size=cfg.rl_batch_size,
        mini_batch_size=cfg.rl_batch_size // PPO_MINI_BATCHES,
        ppo_epochs=cfg.rl_epochs,
        init_kl_coef=cfg.kl_coef,
        adap_kl_ctrl=False,
        seed=cfg.seed,
    )


def _ppo_trainer(trainer_class, config, model, tokenizer):
    # the demo batches its own prompts (exactly config.batch_size per step), so the no-dataset warning
    # meant for users who may not have set the batch size is noise here
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="no dataset given", category=UserWarning)
        return trainer_class(config, model, None, tokenizer)


def train_ppo(cfg: DemoConfig, sft: StageResult, reward: StageResult, preferences: StageResult, out: Path):
    from rlhfkit.models.value_head import AutoModelForCausalLMWithValueHead
    from rlhfkit.rewards.scoring import RewardScorer
    from rlhfkit.trainers.ppo import PPOTrainer

    tokenizer = load_tokenizer(sft.path)
    model = AutoModelForCausalLMWithValueHead.from_pretrained(str(sft.path), dtype=torch.float32)
    trainer = _ppo_trainer(PPOTrainer, _ppo_config(cfg, cfg.rl_learning_rate), model, tokenizer)
    reward_model = load_reward_model(sft, reward)
    scorer = RewardScorer(reward_model, tokenizer, device=reward_model.device)
    summary = _ppo_loop(cfg, trainer, tokenizer, scorer, out)
    trainer.policy.pretrained_model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return summary


def train_ppo_multi_adapter(
    cfg: DemoConfig, sft: StageResult, reward: StageResult, preferences: StageResult, out: Path
):
    """One SFT base in memory: the policy LoRA trains, the frozen reward adapter scores.

    TRL 0.x's multi-adapter RL."""
    from rlhfkit.models.value_head import AutoModelForCausalLMWithValueHead
    from rlhfkit.rewards.scoring import RewardScorer
    from rlhfkit.trainers.ppo import PPOTrainer

    tokenizer = load_tokenizer(sft.path)
    model = AutoModelForCausalLMWithValueHead.from_pretrained(
        str(sft.path),
        peft_config=adapter_lora(cfg, "CAUSAL_LM"),
        reward_adapter=str(reward.path),
        dtype=torch.float32,
    )
    # LoRA updates are low-rank and start at zero: they need a larger step than full fine-tuning
    trainer = _ppo_trainer(PPOTrainer, _ppo_config(cfg, 4 * cfg.rl_learning_rate), model, tokenizer)
    scorer = RewardScorer(trainer.policy, tokenizer, device=trainer.policy.device)  # its reward adapter
    summary = _ppo_loop(cfg, trainer, tokenizer, scorer, out)
    peft_model = trainer.policy.pretrained_model
    peft_model.set_adapter("default")
    merged = peft_model.merge_and_unload(adapter_names=["default"])
    merged.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return summary


# ---------------------------------------------------------------------- DPO (offline, on the same pairs)
def train_dpo(cfg: DemoConfig, sft: StageResult, reward: StageResult, preferences: StageResult, out: Path):
    from rlhfkit.trainers.dpo.config import DPOConfig
    from rlhfkit.trainers.dpo.trainer import DPOTrainer

    tokenizer = load_tokenizer(sft.path)
    train = load_pairs(preferences, "train", with_eos=False)
    steps_per_epoch = max(1, len(train) // 16)
    args = DPOConfig(
        beta=cfg.dpo_beta,
        per_device_train_batch_size=16,
        num_train_epochs=cfg.dpo_epochs,
        learning_rate=cfg.dpo_learning_rate,
        **cosine_schedule(steps_per_epoch, 5),
        max_length=None,
        max_prompt_length=None,
        **trainer_defaults(cfg, out),
    )
    trainer = DPOTrainer(
        model=str(sft.path), ref_model=None, args=args, train_dataset=train, processing_class=tokenizer
    )
    steps = -(-len(train) // 16) * cfg.dpo_epochs
    result = _train_and_save(
        trainer, tokenizer, out, win_rate_callback(cfg, tokenizer, steps, out, trainer=trainer)
    )
    history = [h for h in trainer.state.log_history if "rewards/margins" in h]
    curves = {
        "step": [h["step"] for h in history],
        "reward": [h["rewards/chosen"] for h in history],
        "reward_rejected": [h["rewards/rejected"] for h in history],
        "accuracy": [h.get("rewards/accuracies") for h in history],
        "win_rate": _win_rate_points(trainer.state.log_history),
    }
    _write_curves(out, curves, trainer.state.log_history)
    summary = _summary(curves, result.global_step)
    summary["final_margin"] = history[-1]["rewards/margins"] if history else None
    return summary


RL_ALGOS: dict[str, Callable[..., dict[str, Any]]] = {
    "rloo": train_rloo,
    "ppo": train_ppo,
    "ppo-multi-adapter": train_ppo_multi_adapter,
    "dpo": train_dpo,
}
