"""Health alarms: each alarm provoked by a hand-built metric sequence, silence on a healthy run, the rate
limit, the warning channel, and real PPO and GRPO runs whose huge learning rate trips an alarm."""

from __future__ import annotations

import copy
import math
import warnings

import pytest

from rlhfkit.trainers.common.health import (
    ALARMS,
    TRAINER_METRICS,
    HealthMonitor,
    HealthThresholds,
    HealthWarning,
    growth_per_step,
    watch,
)

PPO, RLOO, GRPO = TRAINER_METRICS["ppo"], TRAINER_METRICS["rloo"], TRAINER_METRICS["grpo"]


def healthy_step(i: int) -> dict[str, float]:
    """GRPO-named metrics of a run that learns calmly: KL and reward rise and level off, entropy eases."""
    return {
        "kl": 0.08 * (1 - math.exp(-i / 5)),
        "entropy": 2.0 - 0.4 * (1 - math.exp(-i / 10)),
        "reward": 1 - math.exp(-i / 8),
        "completions/mean_length": 10.0 + (i % 3) * 0.5,
        "clip_ratio/region_mean": 0.05,
        "sampling/sampling_logp_difference/mean": 1e-6,
        "sampling/sampling_logp_difference/max": 1e-5,
        "eval/win_rate": 0.5 + 0.01 * i if i % 5 == 0 else None,
    }


def run(monitor: HealthMonitor, steps: list[dict], first: int = 1) -> tuple[list[dict], list[str]]:
    """Check each step's metrics (None entries left out); the health values per step and every warning."""
    values, messages = [], []
    for step, metrics in enumerate(steps, start=first):
        found, said = monitor.check({k: v for k, v in metrics.items() if v is not None}, step)
        values.append(found)
        messages.extend(said)
    return values, messages


def test_a_healthy_run_raises_no_alarm():
    values, messages = run(HealthMonitor(GRPO), [healthy_step(i) for i in range(60)])
    assert messages == []
    assert all(v["health/alarms"] == 0.0 for v in values)
    last = values[-1]
    # every alarm had its metrics: each reports "does not hold"
    assert {f"health/{kind}" for kind in ALARMS} <= set(last)
    assert 0.7 < last["health/entropy_ratio"] < 1.0


def test_growth_per_step_is_the_geometric_rate():
    # 1 -> 4 over two steps: x2 per step, +100%/step
    assert growth_per_step([(1, 1.0), (2, 2.0), (3, 4.0)]) == pytest.approx(1.0)
    assert growth_per_step([(5, 8.0), (8, 1.0)]) == pytest.approx(-0.5)


# -------------------------------------------------------------------------------- (1) KL runaway
def test_kl_growing_with_a_fixed_coefficient_warns_with_its_option():
    # GRPO's kl is per token: 0.06 nats/token x1.5 per step, above the 0.05 floor from the start
    values, messages = run(HealthMonitor(GRPO), [{"kl": 0.06 * 1.5**i} for i in range(8)])
    assert len(messages) == 1 and "kl_runaway" in messages[0] and "raise beta" in messages[0]
    assert messages[0].startswith("step 5,")  # the first step with a full window of 5
    assert values[4]["health/kl_growth"] == pytest.approx(0.5)
    assert "health/kl_runaway" not in values[3]  # too few points for a rate yet


def test_kl_below_the_floor_may_grow_freely():
    # RLOO's KL is a sum over 10 tokens: 0.3 nats < 0.05 nats/token * 10 tokens, though doubling each step
    steps = [{"objective/kl": 0.3 / 2 ** (6 - i), "completions/mean_length": 10.0} for i in range(7)]
    values, messages = run(HealthMonitor(RLOO), steps)
    assert messages == [] and values[-1]["health/kl_runaway"] == 0.0
    assert values[-1]["health/kl_growth"] == pytest.approx(1.0)


def test_kl_against_an_adaptive_controller():
    # PPO's adaptive controller raises its coefficient by at most 0.2 * 256 / 10000 = 0.512% per step
    hold = 0.2 * 256 / 10000

    def monitor():
        return HealthMonitor(PPO, kl_target=6.0, kl_hold_rate=hold)

    _, fast = run(monitor(), [{"objective/kl": 8.0 * 1.2**i} for i in range(6)])
    assert len(fast) == 1 and "adaptive controller" in fast[0] and "init_kl_coef" in fast[0]
    _, slow = run(monitor(), [{"objective/kl": 8.0 * 1.05**i} for i in range(6)])  # 5% < 0.512% + 10%
    assert slow == []
    _, below = run(monitor(), [{"objective/kl": 0.5 * 1.5**i} for i in range(6)])  # still under the target 6
    assert below == []


# -------------------------------------------------------------------------------- (2) entropy collapse
def test_entropy_collapse():
    # 5 steps at 2.0 are the start; the mean of the last 5 falls below 0.3 * 2.0 = 0.6
    entropies = [2.0] * 5 + [0.5] * 5
    values, messages = run(HealthMonitor(PPO), [{"ppo/policy/entropy": e} for e in entropies])
    assert len(messages) == 1 and "entropy_collapse" in messages[0] and messages[0].startswith("step 10,")
    # step 9: last five are 2.0, 0.5, 0.5, 0.5, 0.5 -> mean 0.8 (40%, no alarm); step 10: 0.5 -> 25%
    assert values[8]["health/entropy_ratio"] == pytest.approx(0.4)
    assert values[9]["health/entropy_ratio"] == pytest.approx(0.25)


# -------------------------------------------------------------------------------- (3) length exploitation
def test_length_growing_while_the_reward_rises():
    steps = [{"tokens/responses_len_mean": 10.0 + 2 * i, "ppo/mean_scores": 0.1 * i} for i in range(10)]
    values, messages = run(HealthMonitor(PPO), steps)
    assert len(messages) == 1 and "length_exploitation" in messages[0] and "grew" in messages[0]
    # start: lengths 10..18 (mean 14), rewards 0..0.4 (0.2); last: 20..28 (24), 0.5..0.9 (0.7)
    assert values[-1]["health/length_drift"] == pytest.approx(24 / 14 - 1)
    assert values[-1]["health/reward_change"] == pytest.approx(0.5)


def test_length_drift_with_a_falling_reward_is_not_exploitation():
    steps = [{"tokens/responses_len_mean": 10.0 + 2 * i, "ppo/mean_scores": -0.1 * i} for i in range(10)]
    values, messages = run(HealthMonitor(PPO), steps)
    assert messages == [] and values[-1]["health/length_exploitation"] == 0.0


# -------------------------------------------------------------------------------- (4) reward hacking
def test_reward_rising_while_the_judge_falls():
    # the learned reward climbs every step; the judge's win rate peaks at step 20, then falls
    judged = {10: 0.6, 20: 0.75, 30: 0.55}
    steps = [{"reward": 0.03 * i, "eval/win_rate": judged.get(i)} for i in range(1, 31)]
    values, messages = run(HealthMonitor(GRPO), steps)
    assert len(messages) == 1 and "reward_hacking" in messages[0] and "checkpoint of step 20" in messages[0]
    assert values[-1]["health/win_rate_drop"] == pytest.approx(0.2)
    assert "health/reward_hacking" not in values[15]  # one judge result: no trend yet


def test_judge_and_reward_falling_together_is_not_hacking():
    judged = {10: 0.75, 20: 0.5}
    steps = [{"reward": 1 - 0.03 * i, "eval/win_rate": judged.get(i)} for i in range(1, 21)]
    values, messages = run(HealthMonitor(GRPO), steps)
    assert messages == [] and values[-1]["health/reward_hacking"] == 0.0


def test_a_judge_logged_separately_for_the_same_step_counts_once():
    monitor = HealthMonitor(GRPO)
    monitor.check({"reward": 0.1, "eval/win_rate": 0.7}, 1)
    monitor.check({"reward": 0.5}, 2)
    values, messages = monitor.check({"eval/win_rate": 0.4}, 2)  # the win-rate callback's own log line
    assert len(messages) == 1 and "reward_hacking" in messages[0]
    again, repeated = monitor.check({"reward": 0.5, "eval/win_rate": 0.4}, 2)  # the step's full log line
    assert repeated == [] and again["health/reward_hacking"] == 1.0


# -------------------------------------------------------------------------------- (5) update blow-up
@pytest.mark.parametrize(
    "names, metrics, expected",
    [
        (PPO, {"ppo/policy/clipfrac": 0.6, "ppo/policy/approxkl": 0.01}, "clip fraction 0.6 > 0.3"),
        (RLOO, {"policy/clipfrac_avg": 0.1, "policy/approxkl_avg": 3.0}, "approx-KL 3 > 1"),
        (GRPO, {"clip_ratio/region_mean": 0.45}, "clip fraction 0.45 > 0.3"),
    ],
)
def test_clip_fraction_or_approx_kl_blowing_up(names, metrics, expected):
    values, messages = HealthMonitor(names).check(metrics, 3)
    assert values["health/update_blowup"] == 1.0
    assert len(messages) == 1 and expected in messages[0] and "lower learning_rate" in messages[0]


# -------------------------------------------------------------------------------- (6) logprob mismatch
@pytest.mark.parametrize(
    "mean, largest, expected",
    [(0.2, 1.0, "mean |sampling - training| logprob 0.2 > 0.05"), (0.01, 8.0, "largest")],
)
def test_sampling_and_training_logprobs_disagree(mean, largest, expected):
    metrics = {
        "sampling/sampling_logp_difference/mean": mean,
        "sampling/sampling_logp_difference/max": largest,
    }
    values, messages = HealthMonitor(GRPO).check(metrics, 1)
    assert values["health/logprob_mismatch"] == 1.0
    assert len(messages) == 1 and expected in messages[0] and "training dtype" in messages[0]


def test_a_gap_of_processed_sampler_logprobs_is_no_mismatch():
    # an engine sampling with top-k reports the truncated distribution's logprobs: the gap to the training
    # pass is then the truncation, and the alarm stays silent while the step says so
    gap = {"sampling/sampling_logp_difference/mean": 0.4, "sampling/sampling_logp_difference/max": 9.0}
    monitor = HealthMonitor(GRPO)
    values, messages = monitor.check({**gap, "sampling/logprobs_processed": 1.0}, 1)
    assert "health/logprob_mismatch" not in values and messages == []
    values, messages = monitor.check(gap, 2)  # the same gap of unprocessed logprobs is a mismatch
    assert values["health/logprob_mismatch"] == 1.0 and len(messages) == 1


def test_the_mismatch_hint_names_only_a_field_the_trainer_has():
    gap = {"sampling/sampling_logp_difference/mean": 0.4}
    grpo = HealthMonitor(GRPO).check(gap, 1)[1][0]
    assert "vllm_importance_sampling_correction=True" in grpo
    rloo = HealthMonitor(TRAINER_METRICS["rloo_current"]).check(gap, 1)[1][0]
    assert "importance" not in rloo and "training dtype" in rloo and "--dtype" in rloo


# -------------------------------------------------------------------------------- limits and channel
def test_an_alarm_that_persists_warns_once_per_warn_every_steps():
    monitor = HealthMonitor(GRPO, HealthThresholds(warn_every=100))
    values, messages = run(monitor, [{"clip_ratio/region_mean": 0.9}] * 250)
    assert all(v["health/update_blowup"] == 1.0 and v["health/alarms"] == 1.0 for v in values)
    assert [m.split(",")[0] for m in messages] == ["step 1", "step 101", "step 201"]


def test_each_kind_warns_on_its_own_line():
    metrics = {"clip_ratio/region_mean": 0.9, "sampling/sampling_logp_difference/mean": 1.0}
    values, messages = HealthMonitor(GRPO).check(metrics, 1)
    assert values["health/alarms"] == 2.0
    assert len(messages) == 2 and all("\n" not in m for m in messages)


def test_non_numbers_and_non_finite_values_are_ignored():
    import numpy as np

    values, messages = HealthMonitor(GRPO).check(
        {"clip_ratio/region_mean": float("nan"), "entropy": np.array([1.0, 2.0]), "reward": "high"}, 1
    )
    assert messages == [] and values == {"health/alarms": 0.0}


def test_watch_warns_on_the_main_process_only():
    monitor = HealthMonitor(GRPO)
    with pytest.warns(HealthWarning, match="update_blowup"):
        found = watch(monitor, {"clip_ratio/region_mean": 0.9}, 1)
    assert found["health/update_blowup"] == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert watch(
            copy.deepcopy(HealthMonitor(GRPO)), {"clip_ratio/region_mean": 0.9}, 1, main_process=False
        )
        assert watch(None, {"clip_ratio/region_mean": 0.9}, 1) == {}


def test_history_round_trips_and_a_restored_monitor_goes_on_like_the_uninterrupted_one(tmp_path):
    import json

    from rlhfkit.trainers.common.checkpointing import load_state, save_state

    steps = [healthy_step(i) for i in range(30)]
    steps[0] = {"eval/win_rate": 0.4}  # judged before any reward: its reward is NaN (stored as None)
    steps[8]["clip_ratio/region_mean"] = steps[14]["clip_ratio/region_mean"] = 0.9  # warns once (rate limit)
    whole = HealthMonitor(GRPO)
    expected_values, expected_messages = run(whole, steps)
    assert [m.split(",")[0] for m in expected_messages] == ["step 9"]

    first = HealthMonitor(GRPO)
    run(first, steps[:10])
    state = first.state_dict()
    text = json.dumps(state, allow_nan=False)  # plain JSON, no NaN
    save_state(tmp_path, "health", state)  # the trainers' checkpoint path
    assert load_state(tmp_path, "health") == json.loads(text) == state
    assert state["warned"] == {"update_blowup": 9} and state["judged"][0] == [1, 0.4, None]

    resumed, fresh = HealthMonitor(GRPO), HealthMonitor(GRPO)
    resumed.load_state_dict(json.loads(text))
    assert resumed.state_dict() == state
    values, messages = run(resumed, steps[10:], first=11)
    assert values == expected_values[10:] and messages == []  # no re-warming, no repeated warning
    assert resumed.state_dict() == whole.state_dict()
    fresh_values, fresh_messages = run(fresh, steps[10:], first=11)
    assert fresh_messages and "health/entropy_ratio" not in fresh_values[0]  # what resuming without it did


@pytest.mark.parametrize(
    "bad", [{"window": 1}, {"entropy_floor": 0}, {"kl_growth": -0.1}, {"warn_every": math.inf}]
)
def test_bad_thresholds_are_named(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=f"HealthThresholds.{name}"):
        HealthThresholds(**bad)


# -------------------------------------------------------------------------------- real trainers
@pytest.mark.slow
def test_ppo_step_with_a_huge_learning_rate_reports_the_blowup():
    import torch

    from rlhfkit import PPOConfig, PPOTrainer
    from rlhfkit.testing import tiny_tokenizer, tiny_value_head_model

    base, tokenizer = tiny_value_head_model("llama", summary_dropout_prob=0.0), tiny_tokenizer()
    g = torch.Generator().manual_seed(0)
    queries = [torch.randint(10, 900, (3 + i % 3,), generator=g) for i in range(4)]
    responses = [torch.randint(10, 900, (2 + (i * 2) % 5,), generator=g) for i in range(4)]
    scores = [torch.tensor(float(i) - 1.5) for i in range(4)]

    def step(learning_rate):
        config = PPOConfig(batch_size=4, mini_batch_size=1, ppo_epochs=4, learning_rate=learning_rate, seed=0)
        trainer = PPOTrainer(config, copy.deepcopy(base), tokenizer=tokenizer)
        return trainer.step(queries, responses, scores)

    calm = step(1e-5)
    assert calm["health/update_blowup"] == 0.0 and calm["health/alarms"] == 0.0
    with pytest.warns(HealthWarning, match="step 1, update_blowup: clip fraction"):
        wild = step(1.0)  # 16 optimizer steps at lr 1: the later minibatches are clipped throughout
    assert wild["health/update_blowup"] == 1.0 and wild["ppo/policy/clipfrac"] > 0.3


@pytest.mark.slow
def test_grpo_run_warns_and_sees_a_win_rate_logged_by_a_callback(tmp_path):
    from transformers import TrainerCallback

    from rlhfkit.rewards import KeywordReward
    from rlhfkit.tasks import toy_prompt_dataset
    from rlhfkit.testing import tiny_model, tiny_tokenizer
    from rlhfkit.trainers.grpo.config import GRPOConfig
    from rlhfkit.trainers.grpo.trainer import GRPOTrainer

    def count_e(completions, **kwargs):
        return KeywordReward("e")(completions)

    class WinRates(TrainerCallback):  # stands in for a win-rate callback: logs through trainer.log
        def on_step_end(self, args, state, control, **kwargs):
            due = control.should_log  # Trainer.log clears it; the update's own log line must still follow
            trainer.log({"eval/win_rate": {1: 0.8, 2: 0.5}[state.global_step]})
            control.should_log = due

    def grpo(health_checks):
        config = GRPOConfig(
            output_dir=str(tmp_path / f"out-{health_checks}"), report_to="none", use_cpu=True, seed=3,
            per_device_train_batch_size=8, num_generations=4, max_completion_length=5, max_steps=2,
            num_iterations=2, learning_rate=1.0, logging_steps=1, save_strategy="no", disable_tqdm=True,
            health_checks=health_checks,
        )  # fmt: skip
        return GRPOTrainer(
            tiny_model("llama"),
            count_e,
            args=config,
            train_dataset=toy_prompt_dataset(n=16),
            processing_class=tiny_tokenizer(padding_side="left"),
            callbacks=[WinRates()],
        )

    trainer = grpo(True)
    with pytest.warns(HealthWarning, match="step 2, update_blowup: clip fraction"):
        trainer.train()  # the second update reuses the first's completions: its ratios are far from 1
    updates = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["health/update_blowup"] for h in updates] == [0.0, 1.0]
    assert updates[0]["health/logprob_mismatch"] == 0.0  # same weights, same numerics: no gap
    judged = [h for h in trainer.state.log_history if "eval/win_rate" in h]
    assert judged[1]["health/win_rate_drop"] == pytest.approx(0.3)  # 0.8 -> 0.5

    trainer = grpo(False)
    trainer.train()
    assert trainer.health is None
    assert not any(k.startswith("health/") for h in trainer.state.log_history for k in h)


@pytest.mark.slow
def test_rloo_logs_health_and_completion_length(tmp_path):
    from rlhfkit.rewards import KeywordReward
    from rlhfkit.tasks import toy_prompt_dataset
    from rlhfkit.testing import tiny_model, tiny_tokenizer
    from rlhfkit.trainers.rloo.config import RLOOConfig
    from rlhfkit.trainers.rloo.trainer import RLOOTrainer

    config = RLOOConfig(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=4,
        rloo_k=2, num_ppo_epochs=1, response_length=5, total_episodes=8, logging_steps=1, save_strategy="no",
        num_sample_generations=0, disable_tqdm=True, seed=3, learning_rate=1e-3,
    )  # fmt: skip
    tokenizer = tiny_tokenizer(padding_side="left")
    trainer = RLOOTrainer(
        config, tokenizer, tiny_model("llama"), None, KeywordReward("e"), toy_prompt_dataset(n=16)
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "objective/scores" in h]
    assert all(0 < h["completions/mean_length"] <= 5 for h in logs)
    assert all(h["health/alarms"] == 0.0 and h["health/update_blowup"] == 0.0 for h in logs)


def test_monitor_for_reads_the_adaptive_controllers_limit():
    from rlhfkit.core.kl import AdaptiveKLController, FixedKLController
    from rlhfkit.trainers.common.health import monitor_for

    controller = AdaptiveKLController(0.2, target=6.0, horizon=10000)
    monitor = monitor_for("ppo", controller, samples_per_step=256)
    assert monitor.kl_target == 6.0 and monitor.kl_hold_rate == pytest.approx(0.2 * 256 / 10000)
    controller.update(100.0, 256)  # far above the target: the largest rise the controller can make
    assert controller.value == pytest.approx(0.2 * (1 + monitor.kl_hold_rate))
    fixed = monitor_for("ppo", FixedKLController(0.2), samples_per_step=256)
    assert fixed.kl_target is None and fixed.kl_hold_rate == 0.0


@pytest.mark.slow
def test_the_win_rate_callbacks_results_reach_the_reward_hacking_alarm(tmp_path):
    from rlhfkit.judges import RuleJudge
    from rlhfkit.rewards import KeywordReward
    from rlhfkit.tasks import toy_prompt_dataset
    from rlhfkit.testing import tiny_model, tiny_tokenizer
    from rlhfkit.trainers.common.win_rate import WinRateCallback
    from rlhfkit.trainers.grpo.config import GRPOConfig
    from rlhfkit.trainers.grpo.trainer import GRPOTrainer

    def count_e(completions, **kwargs):
        return KeywordReward("e")(completions)

    config = GRPOConfig(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=5, max_steps=2, logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=3, learning_rate=1e-3,
    )  # fmt: skip
    tokenizer = tiny_tokenizer(padding_side="left")
    trainer = GRPOTrainer(
        tiny_model("llama"),
        count_e,
        args=config,
        train_dataset=toy_prompt_dataset(n=16),
        processing_class=tokenizer,
    )
    prompts = [f"Tell me about topic {i}:" for i in range(6)]
    judge = RuleJudge.of_texts(KeywordReward("e"))
    trainer.add_callback(WinRateCallback(judge, prompts, trainer=trainer, every_n_steps=1, max_new_tokens=4))
    trainer.train()
    judged = [h for h in trainer.state.log_history if "eval/win_rate" in h]
    assert [h["step"] for h in judged] == [1, 2]
    first, second = (h["eval/win_rate"] for h in judged)
    assert "health/win_rate_drop" not in judged[0]  # one judge result: no trend yet
    assert judged[1]["health/win_rate_drop"] == pytest.approx(max(first, second) - second)
    assert "health/reward_hacking" in judged[1]
