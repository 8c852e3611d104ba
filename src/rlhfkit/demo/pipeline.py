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

import time
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
    runner.quiet_runtime(cfg)
    console = runner.make_console()
    root = Path(cfg.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results: dict[str, StageResult] = {}
    run = runner.stage_runner(cfg, root, console, results)
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
    adapter = stages.reward_uses_adapter(cfg)
    rm_params = {
        **cfg.values(*STAGE_FIELDS["reward"]),
        "adapter": adapter,
        "center_rewards_coefficient": stages.CENTER_REWARDS_COEFFICIENT,
    }
    if adapter:
        rm_params.update(lora_r=cfg.lora_r, version=stages.REWARD_ADAPTER_VERSION)
    reward = run(
        "reward",
        Stage(
            "reward_adapter" if adapter else "reward_model",
            "4/6 reward model",
            rm_params,
            lambda out: stages.train_reward(cfg, sft, prefs, out),
            [sft, prefs],
        ),
    )
    train = rl.RL_ALGOS[cfg.algo]
    title = (
        "DPO on the preference pairs" if cfg.algo == "dpo" else f"RL: {cfg.algo} against the learned reward"
    )
    policy = run(
        "rl",
        Stage(
            f"rl-{cfg.algo}",
            f"5/6 {title}",
            cfg.values("seed", *RL_FIELDS[cfg.algo], *STAGE_FIELDS["curve"]),
            lambda out: train(cfg, sft, reward, prefs, out),
            [sft, reward, prefs],
        ),
    )
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
    metrics = write_report(cfg, root, results, samples, time.perf_counter() - start)
    _print_outcome(console, cfg.algo, metrics["evaluation"], root)
    return metrics


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
            f"{100 * ev['win_rate_rl_vs_sft_classifier']:.1f}%[/] (95% interval {100 * low:.1f}-{100 * high:.1f}%). "
            + judges_sentence(algo, ev)
        )
