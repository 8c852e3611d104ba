"""`run_demo`: the whole SFT -> reward model -> RL -> judge pipeline as a chain of cached stages.

Stage folders under `output_dir`:
  base/                the tokenizer and the untrained policy
  sft/                 the SFT policy (SFTTrainer, packed reviews)
  preferences/         train.jsonl / eval.jsonl pairs of SFT samples labelled by VADER
  reward_model/        the learned reward model (reward_adapter/ for ppo-multi-adapter)
  rl-<algo>/           the RL policy, curves.json (with the win-rate curve), samples.jsonl (its judged pairs)
  polarity_judge/      the second judge: a classifier trained on the review generator's own labels
  evaluation-<algo>/   metrics.json, samples.jsonl
and at the top: report.md, metrics.json, plots/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlhfkit.demo import evaluation, rl, runner, stages
from rlhfkit.demo.cache import Stage, StageResult
from rlhfkit.demo.config import DemoConfig
from rlhfkit.demo.report import write_report

# the DemoConfig fields each stage depends on: changing one re-runs that stage and those after it
STAGE_FIELDS = {
    "sft": ("seed", "sft_num_reviews", "sft_steps", "sft_batch_size", "sft_seq_length", "sft_learning_rate"),
    "preferences": ("seed", "pref_num_prompts", "pref_eval_fraction", "response_length", "temperature"),
    "reward": ("seed", "rm_epochs", "rm_batch_size", "rm_learning_rate"),
    "evaluation": ("seed", "eval_num_prompts", "temperature", "response_length"),
    "curve": ("curve_points", "curve_num_prompts"),  # the RL stage's win-rate curve (every algo)
}
_ONLINE = (
    "rl_updates",
    "rl_batch_size",
    "rl_learning_rate",
    "rl_epochs",
    "kl_coef",
    "temperature",
    "response_length",
)
RL_FIELDS = {
    "rloo": _ONLINE + ("rloo_k",),
    "ppo": _ONLINE,
    "ppo-multi-adapter": _ONLINE + ("lora_r",),
    "dpo": ("dpo_epochs", "dpo_beta", "dpo_learning_rate"),
}


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Run (or reuse) every stage, write the report; returns the metrics written to metrics.json."""
    if cfg.task != "sentiment":  # a verifiable task: exact reward, GRPO, no reward model
        from rlhfkit.demo.verifiable import run_verifiable_demo

        return run_verifiable_demo(cfg)
    demo = runner.begin(cfg)
    run, console, root = demo.run, demo.console, demo.root
    base = run(
        "base", Stage("base", "1/6 base model", cfg.values("model"), lambda out: stages.build_base(cfg, out))
    )
    sft = run(
        "sft",
        Stage(
            "sft",
            "2/6 supervised fine-tuning",
            cfg.values(*STAGE_FIELDS["sft"]),
            lambda out: stages.train_sft(cfg, base, out),
            [base],
        ),
    )
    prefs = run(
        "preferences",
        Stage(
            "preferences",
            "3/6 preference pairs (SFT samples, VADER labels)",
            cfg.values(*STAGE_FIELDS["preferences"]),
            lambda out: stages.make_preferences(cfg, sft, out),
            [sft],
        ),
    )
    reward = run("reward", _reward_stage(cfg, sft, prefs))
    policy = run("rl", _rl_stage(cfg, sft, reward, prefs))
    polarity = run(
        "polarity_judge",
        Stage(
            "polarity_judge",
            "6/6 second judge (classifier on the review generator's labels)",
            {"seed": cfg.seed, "reviews": stages.POLARITY_REVIEWS, "version": stages.POLARITY_VERSION},
            lambda out: stages.train_polarity_judge(cfg, out),
        ),
    )
    evaluated = run(
        "evaluation",
        Stage(
            f"evaluation-{cfg.algo}",
            "6/6 evaluation (gold judge and second judge)",
            cfg.values(*STAGE_FIELDS["evaluation"]),
            lambda out: evaluation.evaluate(cfg, sft, reward, policy, out, polarity),
            [sft, reward, policy, polarity],
        ),
    )
    samples = evaluation.read_samples(evaluated)
    evaluation.print_samples(samples[: cfg.eval_samples_shown], cfg.algo, console)
    metrics = write_report(cfg, root, demo.results, samples, demo.seconds())
    _print_outcome(console, cfg.algo, metrics["evaluation"], root)
    return metrics


def _reward_stage(cfg: DemoConfig, sft: StageResult, prefs: StageResult) -> Stage:
    """Stage 4: the reward model, a separate network or (ppo-multi-adapter) a LoRA adapter on the SFT base."""
    adapter = stages.reward_uses_adapter(cfg)
    params = {
        **cfg.values(*STAGE_FIELDS["reward"]),
        "adapter": adapter,
        "center_rewards_coefficient": stages.CENTER_REWARDS_COEFFICIENT,
    }
    if adapter:
        params.update(lora_r=cfg.lora_r, version=stages.REWARD_ADAPTER_VERSION)
    return Stage(
        "reward_adapter" if adapter else "reward_model",
        "4/6 reward model",
        params,
        lambda out: stages.train_reward(cfg, sft, prefs, out),
        [sft, prefs],
    )


def _rl_stage(cfg: DemoConfig, sft: StageResult, reward: StageResult, prefs: StageResult) -> Stage:
    """Stage 5: `cfg.algo` trains the SFT policy (DPO on the pairs, the others against the reward model)."""
    train = rl.RL_ALGOS[cfg.algo]
    if cfg.algo == "dpo":
        title = "DPO on the preference pairs"
    else:
        title = f"RL: {cfg.algo} against the learned reward"
    return Stage(
        f"rl-{cfg.algo}",
        f"5/6 {title}",
        cfg.values("seed", *RL_FIELDS[cfg.algo], *STAGE_FIELDS["curve"]),
        lambda out: train(cfg, sft, reward, prefs, out),
        [sft, reward, prefs],
    )


def _print_outcome(console: Any, algo: str, ev: dict[str, Any], root: Path) -> None:
    from rlhfkit.demo.report import judges_sentence

    console.print(
        f"[bold]win rate of {algo} over SFT (gold judge): {100 * ev['win_rate_rl_vs_sft']:.1f}%[/]  "
        f"gold score {ev['gold_score_sft']:.3f} -> {ev['gold_score_rl']:.3f}, KL {ev['kl_rl_to_sft']:.2f}; "
        f"report: {root / 'report.md'}"
    )
    if "win_rate_rl_vs_sft_classifier" in ev:
        low, high = ev["win_rate_classifier_ci95"]
        console.print(
            f"[bold]win rate under the second judge (polarity classifier): "
            f"{100 * ev['win_rate_rl_vs_sft_classifier']:.1f}%[/] "
            f"(95% interval {100 * low:.1f}-{100 * high:.1f}%). " + judges_sentence(algo, ev)
        )
