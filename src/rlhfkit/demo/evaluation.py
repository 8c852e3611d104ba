"""Evaluation on held-out prompts: the RL policy against the SFT policy, judged by the gold judge.

Both policies sample one completion per test prompt (same temperature and seed). The gold judge
(VADER) scores each whole review; the win rate is `rlhfkit.judges.win_rate` (a tie counts half, 95% Wilson
interval), the same as the win-rate callback and `rlhfkit judge` report. Also reported:
mean gold score, mean learned-reward score, and KL(RL || SFT) of the RL samples, summed over tokens.

A second judge, different in kind, gives a second win rate: the polarity classifier trained on the review
generator's own labels (`rlhfkit.tasks.polarity`), which never saw VADER's. A win under VADER alone (the
judge that labelled the preference data) then shows as a disagreement. distinct-2 (the share of distinct
word pairs among all of a policy's completions) is a cheap sign of degenerate, repetitive samples.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlhfkit.demo.cache import StageResult
from rlhfkit.demo.config import DemoConfig
from rlhfkit.demo.sampling import Completions, sample_completions
from rlhfkit.demo.stages import load_policy, load_reward_model, load_tokenizer
from rlhfkit.judges import TIE, win_rate


def judgements(scores: Sequence[float], baseline_scores: Sequence[float]) -> list[int]:
    """Pairwise verdicts on `[baseline, model]` from per-prompt scores.

    1 = the model wins, 0 = it loses, TIE otherwise."""
    if len(scores) != len(baseline_scores) or not scores:
        raise ValueError(
            f"need two equally long non-empty score lists, got {len(scores)} and {len(baseline_scores)}"
        )
    return [1 if a > b else TIE if a == b else 0 for a, b in zip(scores, baseline_scores)]


@torch.no_grad()
def learned_scores(reward_model, samples: Completions) -> list[float]:
    from rlhfkit.rewards.scoring import RewardScorer

    device = next(reward_model.parameters()).device
    scorer = RewardScorer(reward_model, tokenizer=None, device=device)
    batch = (samples.query_ids, samples.query_mask, samples.responses, samples.response_mask)
    scores, _ = scorer(*(t.to(device) for t in batch))
    return scores.tolist()


@torch.no_grad()
def kl_to_reference(
    policy, reference, samples: Completions, temperature: float, chunk: int = 64
) -> list[float]:
    """Per sample, sum over its tokens of log pi(y_t) - log pi_ref(y_t): an unbiased KL estimate."""
    from rlhfkit.rollout import forward_response

    values = []
    for start in range(0, len(samples.prompts), chunk):
        rows = slice(start, start + chunk)
        args = (
            samples.query_ids[rows],
            samples.query_mask[rows],
            samples.responses[rows],
            samples.response_mask[rows],
        )
        logprobs = forward_response(policy, *args, temperature=temperature).logprobs
        ref_logprobs = forward_response(reference, *args, temperature=temperature).logprobs
        values += ((logprobs - ref_logprobs) * samples.response_mask[rows]).sum(1).tolist()
    return values


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values))


def distinct_2(texts: Sequence[str]) -> float:
    """Distinct word bigrams over all bigrams of `texts` (0 when none has two words): low = repetitive."""
    bigrams = [pair for text in texts for pair in zip(text.split(), text.split()[1:])]
    return len(set(bigrams)) / len(bigrams) if bigrams else 0.0


def second_judge_metrics(
    prompts: Sequence[str], rl_reviews: Sequence[str], sft_reviews: Sequence[str], classifier
) -> tuple[dict[str, Any], list[float], list[float]]:
    """The RL-vs-SFT win rate under the classifier, through the `rlhfkit.judges` pairwise interface;
    also returns the classifier's P(positive) of each RL and SFT review."""
    from rlhfkit.judges import RuleJudge

    judge = RuleJudge.of_texts(classifier)
    rl_scores, sft_scores = judge.scores(prompts, rl_reviews), judge.scores(prompts, sft_reviews)
    verdicts = judge.judge(list(prompts), [[s, r] for s, r in zip(sft_reviews, rl_reviews)])
    rate, low, high = win_rate(verdicts, model_index=1)
    metrics = {
        "win_rate_rl_vs_sft_classifier": rate,
        "win_rate_classifier_ci95": [low, high],
        "classifier_score_sft": _mean(sft_scores),
        "classifier_score_rl": _mean(rl_scores),
    }
    return metrics, rl_scores, sft_scores


def judges_verdict(rate: float, low: float, high: float) -> str:
    """ "better", "worse" or "no difference": where a win rate's 95% interval lies relative to 50%."""
    return "better" if low > 0.5 else "worse" if high < 0.5 else "no difference"


def evaluate(
    cfg: DemoConfig,
    sft: StageResult,
    reward: StageResult,
    rl: StageResult,
    out: Path,
    classifier: StageResult | None = None,
) -> dict[str, Any]:
    """Sample both policies on the test prompts and write metrics.json and samples.jsonl into `out`.
    `classifier`: the second judge's stage (`stages.train_polarity_judge`); None judges by VADER alone."""
    from rlhfkit.rewards import SentimentJudge
    from rlhfkit.tasks import review_prompts

    tokenizer = load_tokenizer(sft.path)
    prompts = review_prompts("test", n=cfg.eval_num_prompts, seed=cfg.seed)
    judge, reward_model = SentimentJudge(), load_reward_model(sft, reward)
    sft_policy, rl_policy = load_policy(sft.path), load_policy(rl.path)
    seed = cfg.seed + 1000  # different draws from the ones the preference pairs were built from
    results = {}
    for name, policy in (("sft", sft_policy), ("rl", rl_policy)):
        samples = sample_completions(policy, tokenizer, prompts, cfg.response_length, cfg.temperature, seed)
        results[name] = {
            "samples": samples,
            "gold": judge(samples.reviews()),
            "learned": learned_scores(reward_model, samples),
        }
    kl = kl_to_reference(rl_policy, sft_policy, results["rl"]["samples"], cfg.temperature)
    verdicts = judgements(results["rl"]["gold"], results["sft"]["gold"])
    rate, low, high = win_rate(verdicts, model_index=1)
    metrics = {
        "algo": cfg.algo,
        "num_prompts": len(prompts),
        "win_rate_rl_vs_sft": rate,
        "win_rate_ci95": [low, high],
        "ties": verdicts.count(TIE),
        "kl_rl_to_sft": _mean(kl),
    }
    if classifier is not None:
        from rlhfkit.tasks.polarity import PolarityClassifier

        reviews = {name: results[name]["samples"].reviews() for name in ("rl", "sft")}
        second, results["rl"]["second"], results["sft"]["second"] = second_judge_metrics(
            prompts, reviews["rl"], reviews["sft"], PolarityClassifier.load(classifier.path)
        )
        metrics.update(second)
        metrics["judges_agree"] = judges_verdict(rate, low, high) == judges_verdict(
            second["win_rate_rl_vs_sft_classifier"], *second["win_rate_classifier_ci95"]
        )
    for name in ("sft", "rl"):
        r = results[name]
        metrics[f"distinct_2_{name}"] = distinct_2(r["samples"].texts)
        metrics[f"gold_score_{name}"] = _mean(r["gold"])
        metrics[f"learned_reward_{name}"] = _mean(r["learned"])
        metrics[f"positive_share_{name}"] = _mean([float(s > 0.05) for s in r["gold"]])
        metrics[f"mean_tokens_{name}"] = float(r["samples"].response_mask.sum(1).float().mean())
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    with open(out / "samples.jsonl", "w", encoding="utf-8") as fh:
        for i, prompt in enumerate(prompts):
            row = {"prompt": prompt}
            for name in ("sft", "rl"):
                r = results[name]
                row.update(
                    {
                        name: r["samples"].texts[i],
                        f"{name}_gold": r["gold"][i],
                        f"{name}_learned": r["learned"][i],
                    }
                )
                if "second" in r:
                    row[f"{name}_classifier"] = r["second"][i]
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return metrics


def read_samples(evaluation: StageResult) -> list[dict[str, Any]]:
    lines = (evaluation.path / "samples.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def print_samples(samples: Sequence[dict[str, Any]], algo: str, console=None) -> None:
    """A rich table: the SFT and the RL completion of the same prompt, with their gold scores."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"held-out prompts: SFT vs {algo} (gold VADER score)", show_lines=True)
    table.add_column("prompt", max_width=24)
    table.add_column("SFT completion", max_width=44)
    table.add_column("gold", justify="right")
    table.add_column(f"{algo} completion", max_width=44)
    table.add_column("gold", justify="right")
    for row in samples:
        table.add_row(
            row["prompt"], row["sft"], f"{row['sft_gold']:+.3f}", row["rl"], f"{row['rl_gold']:+.3f}"
        )
    (console or Console()).print(table)
