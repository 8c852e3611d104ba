"""Health alarms: each step's logged metrics in, `health/*` metrics and rate-limited one-line warnings out.

An RL run can go wrong while its loss looks fine: the KL to the reference runs away, the policy turns
deterministic, completions grow longer because the reward model likes length, the learned reward rises
while a judge's win rate falls, updates move the policy so far that PPO's clipping does all the work, or
the logprobs of the sampler and of the training forward pass disagree. `HealthMonitor.check` reads the
metrics a trainer logs anyway (under the trainer's own names, mapped once in `TRAINER_METRICS`), keeps
the first and the last `window` values of each, and says which of these patterns hold now.

`check` is pure apart from that history: it returns the values and the warnings due, and the trainers
hand the warnings to `warnings.warn` with the `HealthWarning` category (main process only, through
`watch`). A kind of alarm warns again only after `warn_every` steps. Calling `check` twice for one step
(a win rate logged separately from the training metrics) replaces that step's values and warns once.
The history (`state_dict`, plain JSON) is saved in the trainers' checkpoints, so a resumed run keeps its
starting values and warning times instead of warming its alarms up again.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from rlhfkit.core.kl import AdaptiveKLController

ALARMS = (
    "kl_runaway",
    "entropy_collapse",
    "length_exploitation",
    "reward_hacking",
    "update_blowup",
    "logprob_mismatch",
)


class HealthWarning(UserWarning):
    """A training-health alarm (filter with `warnings.filterwarnings("ignore", category=HealthWarning)`)."""


@dataclass(frozen=True)
class HealthThresholds:
    """When each alarm fires; the defaults are documented in docs/health.md."""

    window: int = 5  # steps averaged for a starting or current value, and spanned by a growth rate
    warn_every: int = 100  # steps before one kind of alarm warns again
    kl_growth: float = 0.1  # KL rise per step (relative) tolerated beyond what the KL controller can follow
    kl_floor: float = 0.05  # nats per token below which a fixed-coefficient KL may grow freely
    entropy_floor: float = 0.3  # entropy below this fraction of its starting value
    length_drift: float = 0.5  # mean completion length moved by this fraction of its start, reward rising
    win_rate_drop: float = 0.1  # judge's win rate fallen this far below its best, learned reward higher
    clipfrac_max: float = 0.3  # fraction of tokens (sequences for RLOO) whose ratio was clipped
    approxkl_max: float = 1.0  # approximate KL between the policy before and after the update
    logp_gap_mean_max: float = 0.05  # mean |sampling - training| logprob per token (nats)
    logp_gap_max_max: float = 5.0  # largest |sampling - training| logprob of one token (nats)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"HealthThresholds.{f.name} must be a positive number, got {value!r}")
        if self.window < 2 or not isinstance(self.window, int):
            raise ValueError(f"HealthThresholds.window must be an integer >= 2, got {self.window!r}")


@dataclass(frozen=True)
class MetricNames:
    """Where one trainer logs each signal the alarms read (None: it does not log it)."""

    kl: str | None = None
    kl_per_token: bool = False  # False: the KL is a sum over a completion's tokens (divided by `length`)
    kl_option: str = "the KL coefficient"  # the config option to raise when the KL runs away
    entropy: str | None = None  # mean per-token entropy
    reward: str | None = None
    length: str | None = None  # mean completion length in tokens
    clipfrac: str | None = None
    approxkl: str | None = None
    logp_gap_mean: str | None = None
    logp_gap_max: str | None = None
    # 1.0 when the sampler's logprobs were of a truncated or penalised distribution (an engine's top-k):
    # the gap then measures the truncation, not a mismatch, and the alarm stays silent
    logp_processed: str | None = None
    logp_gap_fix: str | None = None  # the config option that corrects a sampling/training gap, if any
    judge: str | None = "eval/win_rate"  # in [0, 1], logged by a win-rate callback when one is given


TRAINER_METRICS = {
    "ppo": MetricNames(
        kl="objective/kl", kl_option="init_kl_coef", entropy="ppo/policy/entropy", reward="ppo/mean_scores",
        length="tokens/responses_len_mean", clipfrac="ppo/policy/clipfrac", approxkl="ppo/policy/approxkl",
    ),
    "rloo": MetricNames(
        kl="objective/kl", kl_option="kl_coef", entropy="policy/entropy_avg", reward="objective/scores",
        length="completions/mean_length", clipfrac="policy/clipfrac_avg", approxkl="policy/approxkl_avg",
    ),
    "grpo": MetricNames(
        kl="kl", kl_per_token=True, kl_option="beta", entropy="entropy", reward="reward",
        length="completions/mean_length", clipfrac="clip_ratio/region_mean",
        logp_gap_mean="sampling/sampling_logp_difference/mean",
        logp_gap_max="sampling/sampling_logp_difference/max",
        logp_processed="sampling/logprobs_processed",
        logp_gap_fix="vllm_importance_sampling_correction=True",
    ),
}  # fmt: skip
# RLOO's current form logs GRPO's names, but its config has no sampler correction
TRAINER_METRICS["rloo_current"] = dataclasses.replace(TRAINER_METRICS["grpo"], logp_gap_fix=None)


class _Series:
    """The first and the last `n` values of one signal, at most one per step."""

    def __init__(self, n: int):
        self.first: list[tuple[int, float]] = []
        self.last: deque[tuple[int, float]] = deque(maxlen=n)
        self.n = n

    def add(self, step: int, value: float) -> None:
        if self.last and self.last[-1][0] == step:  # the same step again: its value is replaced
            self.last[-1] = (step, value)
            if self.first and self.first[-1][0] == step:
                self.first[-1] = (step, value)
            return
        self.last.append((step, value))
        if len(self.first) < self.n:
            self.first.append((step, value))

    @property
    def ready(self) -> bool:
        """Both the starting and the current mean exist (and need not share every value)."""
        return len(self.first) == self.n and len(self.last) == self.n

    @property
    def start(self) -> float:
        return sum(v for _, v in self.first) / len(self.first)

    @property
    def now(self) -> float:
        return sum(v for _, v in self.last) / len(self.last)

    @property
    def latest(self) -> float:
        return self.last[-1][1]


def growth_per_step(points: list[tuple[int, float]]) -> float:
    """Relative growth per step from the first to the last (step, value) point: (last/first)^(1/steps) - 1."""
    (s0, v0), (s1, v1) = points[0], points[-1]
    return (v1 / v0) ** (1.0 / max(s1 - s0, 1)) - 1.0


def _as_number(value: Any) -> float | None:
    """A finite float from a logged scalar (float, numpy or torch scalar); None for anything else."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class HealthMonitor:
    """Reads one trainer's metrics step by step; see the module docstring.

    `names`: where that trainer logs each signal (`TRAINER_METRICS[...]`). `kl_target` and `kl_hold_rate`
    describe an adaptive KL controller (PPO's `adap_kl_ctrl`): its target KL and the largest relative rise
    of its coefficient in one step; without them the coefficient is taken as fixed.
    """

    def __init__(
        self,
        names: MetricNames,
        thresholds: HealthThresholds | None = None,
        *,
        kl_target: float | None = None,
        kl_hold_rate: float = 0.0,
    ):
        self.names = names
        self.thresholds = thresholds if thresholds is not None else HealthThresholds()
        self.kl_target, self.kl_hold_rate = kl_target, kl_hold_rate
        self._series: dict[str, _Series] = {}
        self._judged: list[tuple[int, float, float]] = []  # (step, win rate, current mean reward)
        self._warned: dict[str, int] = {}
        self._alarms = {
            "kl_runaway": self._kl_runaway,
            "entropy_collapse": self._entropy_collapse,
            "length_exploitation": self._length_exploitation,
            "reward_hacking": self._reward_hacking,
            "update_blowup": self._update_blowup,
            "logprob_mismatch": self._logprob_mismatch,
        }

    def check(self, metrics: Mapping[str, Any], step: int) -> tuple[dict[str, float], list[str]]:
        """Record this step's metrics; return `health/*` values and the one-line warnings due now.

        `health/<alarm>` is 1.0 while an alarm's pattern holds and 0.0 when it does not (absent while its
        metrics are missing or too few); `health/alarms` counts those that hold.
        """
        self._record(metrics, step)
        values: dict[str, float] = {}
        messages = []
        for kind, test in self._alarms.items():
            found = test()
            if found is None:
                continue
            measured, message = found
            values.update(measured)
            values[f"health/{kind}"] = float(message is not None)
            if message is not None and self._due(kind, step):
                messages.append(f"step {step}, {kind}: {message}")
        values["health/alarms"] = sum(values.get(f"health/{kind}", 0.0) for kind in ALARMS)
        return values, messages

    def _record(self, metrics: Mapping[str, Any], step: int) -> None:
        for f in fields(self.names):
            key = getattr(self.names, f.name)
            if f.name in ("kl_per_token", "kl_option", "logp_gap_fix", "judge") or key not in metrics:
                continue
            value = _as_number(metrics[key])
            if value is not None:
                self._series.setdefault(f.name, _Series(self.thresholds.window)).add(step, value)
        rate = _as_number(metrics.get(self.names.judge)) if self.names.judge else None
        if rate is not None:
            reward = self._series.get("reward")
            entry = (step, rate, reward.now if reward is not None else math.nan)
            if self._judged and self._judged[-1][0] == step:
                self._judged[-1] = entry
            else:
                self._judged.append(entry)

    def state_dict(self) -> dict[str, Any]:
        """The history the alarms read, as JSON-ready lists and numbers (a NaN reward becomes None)."""
        return {
            "series": {
                name: {"first": [list(p) for p in series.first], "last": [list(p) for p in series.last]}
                for name, series in self._series.items()
            },
            "judged": [
                [step, rate, None if math.isnan(reward) else reward] for step, rate, reward in self._judged
            ],
            "warned": dict(self._warned),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back a `state_dict()`; each window keeps at most this monitor's `thresholds.window` values."""
        self._series = {}
        for name, saved in state["series"].items():
            series = self._series[name] = _Series(self.thresholds.window)
            series.first = [(int(step), float(value)) for step, value in saved["first"]][: series.n]
            series.last.extend((int(step), float(value)) for step, value in saved["last"])
        self._judged = [
            (int(step), float(rate), math.nan if reward is None else float(reward))
            for step, rate, reward in state["judged"]
        ]
        self._warned = {str(kind): int(step) for kind, step in state["warned"].items()}

    def _due(self, kind: str, step: int) -> bool:
        last = self._warned.get(kind)
        if last is not None and 0 <= step - last < self.thresholds.warn_every:
            return False
        self._warned[kind] = step
        return True

    # ------------------------------------------------------------------ the alarms: (values, message or None)
    def _kl_runaway(self) -> tuple[dict[str, float], str | None] | None:
        kl, t = self._series.get("kl"), self.thresholds
        if kl is None or len(kl.last) < t.window or min(v for _, v in kl.last) <= 0:
            return None
        points, value = list(kl.last), kl.latest
        growth = growth_per_step(points)
        unit = "nats/token" if self.names.kl_per_token else "nats"
        coef = self.names.kl_option
        if self.kl_target is not None:  # adaptive: below its target the controller lets the KL rise
            floor = self.kl_target
            how = (
                f"is above its target {self.kl_target:.3g} and grows {growth:.0%}/step, faster than the "
                f"adaptive controller can follow (+{self.kl_hold_rate:.1%}/step at most)"
            )
        else:
            length = self._series.get("length")
            per_sequence = not self.names.kl_per_token and length is not None
            floor = t.kl_floor * (length.latest if per_sequence else 1.0)
            how = f"grows {growth:.0%}/step and the fixed {coef} penalty does not hold it"
        found = min(v for _, v in points) > floor and growth > self.kl_hold_rate + t.kl_growth
        message = f"KL {value:.3g} {unit} {how}: lower learning_rate or raise {coef}" if found else None
        return {"health/kl_growth": growth}, message

    def _entropy_collapse(self) -> tuple[dict[str, float], str | None] | None:
        entropy = self._series.get("entropy")
        if entropy is None or not entropy.ready or entropy.start <= 0:
            return None
        ratio = entropy.now / entropy.start
        message = None
        if ratio < self.thresholds.entropy_floor:
            message = (
                f"entropy {entropy.now:.3g} fell to {ratio:.0%} of its start ({entropy.start:.3g}), the "
                f"policy is turning deterministic: lower learning_rate or raise {self.names.kl_option}"
            )
        return {"health/entropy_ratio": ratio}, message

    def _length_exploitation(self) -> tuple[dict[str, float], str | None] | None:
        length, reward = self._series.get("length"), self._series.get("reward")
        if length is None or reward is None or not (length.ready and reward.ready) or length.start <= 0:
            return None
        drift, rise = length.now / length.start - 1.0, reward.now - reward.start
        message = None
        if abs(drift) > self.thresholds.length_drift and rise > 0:
            message = (
                f"completions {'grew' if drift > 0 else 'shrank'} {abs(drift):.0%} "
                f"(to {length.now:.3g} tokens) while the reward rose by {rise:.3g}: the reward may pay for "
                "length rather than quality; read samples, add a length penalty or judge the completions"
            )
        return {"health/length_drift": drift, "health/reward_change": rise}, message

    def _reward_hacking(self) -> tuple[dict[str, float], str | None] | None:
        if len(self._judged) < 2:
            return None
        best_step, best, best_reward = max(self._judged, key=lambda entry: entry[1])  # the first best
        _, rate, reward = self._judged[-1]
        drop = best - rate
        message = None
        if drop > self.thresholds.win_rate_drop and reward > best_reward:  # NaN rewards compare False
            message = (
                f"the learned reward rose ({best_reward:.3g} -> {reward:.3g}) while the judge's win rate "
                f"fell from {best:.1%} to {rate:.1%}: the policy may be gaming the reward model; keep the "
                f"checkpoint of step {best_step}, raise {self.names.kl_option} or retrain the reward model "
                "on fresh samples"
            )
        return {"health/win_rate_drop": drop}, message

    def _update_blowup(self) -> tuple[dict[str, float], str | None] | None:
        t = self.thresholds
        found = self._over(
            ("clipfrac", "clip fraction", t.clipfrac_max), ("approxkl", "approx-KL", t.approxkl_max)
        )
        if found is None:
            return None
        message = None
        if found:
            message = (
                f"{' and '.join(found)}: each update moves the policy too far; lower learning_rate, or "
                "train on more or larger mini-batches with fewer epochs"
            )
        return {}, message

    def _logprob_mismatch(self) -> tuple[dict[str, float], str | None] | None:
        t = self.thresholds
        if self._logprobs_processed():
            return None
        found = self._over(
            ("logp_gap_mean", "mean |sampling - training| logprob", t.logp_gap_mean_max),
            ("logp_gap_max", "largest |sampling - training| logprob", t.logp_gap_max_max),
        )
        if found is None:
            return None
        message = None
        if found:
            fix = self.names.logp_gap_fix
            message = (
                f"{' and '.join(found)} nats: the sampler and the training forward pass disagree; generate "
                "in the training dtype with dropout off (a vLLM server: --dtype of the trainer's weights)"
                + (f", or correct for the gap with importance weights ({fix})" if fix else "")
            )
        return {}, message

    def _logprobs_processed(self) -> bool:
        """The latest gap was measured on processed sampler logprobs (`MetricNames.logp_processed`)."""
        flag, gap = self._series.get("logp_processed"), self._series.get("logp_gap_mean")
        gap = gap or self._series.get("logp_gap_max")
        if flag is None or gap is None:
            return False
        return any(step == gap.last[-1][0] and value > 0 for step, value in flag.last)

    def _over(self, *limits: tuple[str, str, float]) -> list[str] | None:
        """For each (signal, label, limit) whose latest value exceeds its limit, 'label value > limit';
        None when none of the signals was logged yet."""
        seen = [
            (label, self._series[name].latest, limit) for name, label, limit in limits if name in self._series
        ]
        if not seen:
            return None
        return [f"{label} {value:.4g} > {limit:.4g}" for label, value, limit in seen if value > limit]


def monitor_for(trainer: str, kl_controller: Any = None, samples_per_step: int = 0) -> HealthMonitor:
    """The monitor of `trainer` (a key of `TRAINER_METRICS`) with default thresholds; an adaptive
    `kl_controller` (PPO's, updated once per step of `samples_per_step` samples) sets the KL alarm's target
    and how fast the controller can follow."""
    if isinstance(kl_controller, AdaptiveKLController):
        hold = kl_controller.max_rise(samples_per_step)
        return HealthMonitor(TRAINER_METRICS[trainer], kl_target=kl_controller.target, kl_hold_rate=hold)
    return HealthMonitor(TRAINER_METRICS[trainer])


def watch(
    monitor: HealthMonitor | None, metrics: Mapping[str, Any], step: int, main_process: bool = True
) -> dict:
    """A trainer's log path: `monitor.check`, its warnings sent to `warnings.warn` as `HealthWarning` on the
    main process only (every process sees the same reduced metrics); the `health/*` values are returned."""
    if monitor is None:
        return {}
    values, messages = monitor.check(metrics, step)
    if main_process:
        for message in messages:
            warnings.warn(message, HealthWarning, stacklevel=2)
    return values


def watch_judge(
    monitor: HealthMonitor | None, logs: Mapping[str, Any], step: int, main_process: bool = True
) -> dict:
    """`watch` for a log line that carries the judge's score (a win-rate callback's), else {}: the training
    metrics of the step were watched already, so only the reward-hacking alarm can change."""
    if monitor is None or monitor.names.judge not in logs:
        return {}
    return watch(monitor, logs, step, main_process)
