"""`rlhfkit demo --task addition|calculator`: a verifiable task, learned from its exact reward with GRPO.

No reward model and no judge: a completion is right or wrong by exact match against the answer. A task with
tools (calculator) trains on tool-call transcripts, runs GRPO with its tools, and is evaluated in episodes
with and without them (`rlhfkit.demo.tool_use`).
Stage folders under `output_dir` (cached and reused like the sentiment demo's):
  base/                  the tokenizer and the untrained tiny policy
  sft-<task>/            a short SFT warm start on train problems (imperfect on purpose)
  rl-grpo-<task>/        the GRPO policy, curves.json (mean reward per step)
  evaluation-<task>/     metrics.json, samples.jsonl: held-out accuracy of the SFT and GRPO policies
and at the top: report.md, metrics.json, plots/.

Accuracy is the share of held-out problems whose *greedy* completion is exactly the answer (what a user
of the model sees, with no sampling luck); the sampled accuracy at the RL temperature is reported beside it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from rlhfkit.demo import runner, stages
from rlhfkit.demo.cache import Stage, StageResult
from rlhfkit.demo.config import DemoConfig
from rlhfkit.demo.sampling import sample_completions
from rlhfkit.judges.win_rates import wilson_interval
from rlhfkit.tasks import Task, get_task

SFT_FIELDS = (
    "seed",
    "sft_steps",
    "sft_batch_size",
    "sft_learning_rate",
    "sft_target_accuracy",
    "response_length",
)
GRPO_FIELDS = (
    "seed",
    "rl_updates",
    "rl_batch_size",
    "rl_learning_rate",
    "rl_epochs",
    "num_generations",
    "kl_coef",
    "temperature",
    "response_length",
)
EVAL_FIELDS = ("seed", "eval_num_prompts", "temperature", "response_length")


# ---------------------------------------------------------------------- 2. SFT warm start
PROBE_SIZE, PROBE_EVERY = 256, 20  # train problems checked, and how often, for --sft_target_accuracy


@dataclass
class ProbeLog:
    """The train-probe accuracies an SFT run saw; the step and accuracy of the policy it went back to."""

    steps: list[int] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    kept_step: int | None = None
    kept_accuracy: float | None = None


def _stop_at_accuracy(
    cfg: DemoConfig, task: Task, tokenizer: Any, log: ProbeLog, near_every: int | None = None
) -> Any:
    """A callback ending SFT once greedy accuracy on PROBE_SIZE *train* problems reaches the target.

    The point where a short SFT run starts to get answers right moves by a hundred steps or more from seed
    to seed; stopping on accuracy puts every seed's warm start at about the same, deliberately imperfect
    level. With `near_every`, once a probe sees any right answer it probes every `near_every` steps and,
    on crossing the target, keeps whichever of the last two probed policies is closer to it: a skill that
    appears within a few steps (the calculator's copying) would otherwise overshoot by luck of the grid.
    """
    from transformers import TrainerCallback

    probe = task.prompt_dataset("train", n=PROBE_SIZE, seed=cfg.seed + 1)
    target = cfg.sft_target_accuracy
    below: dict[str, Any] = {}  # the last probed policy under the target: its weights, step and accuracy

    class StopAtAccuracy(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            near = near_every is not None and bool(log.accuracies) and log.accuracies[-1] > 0
            if state.global_step % (near_every if near else PROBE_EVERY):
                return control
            accuracy = _greedy_accuracy(cfg, task, model, tokenizer, probe)
            log.steps.append(state.global_step)
            log.accuracies.append(accuracy)
            if accuracy < target:
                if near_every is not None:
                    below.update(weights=_weights_copy(model), step=state.global_step, accuracy=accuracy)
                return control
            control.should_training_stop = True  # never un-stop the trainer's own max_steps stop
            if below and target - below["accuracy"] < accuracy - target:
                model.load_state_dict(below["weights"])
                log.kept_step, log.kept_accuracy = below["step"], below["accuracy"]
            return control

    return StopAtAccuracy()


def _weights_copy(model: Any) -> dict[str, Any]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _greedy_accuracy(cfg: DemoConfig, task: Task, model: Any, tokenizer: Any, data: Any) -> float:
    """The share of `data`'s problems the policy answers right, greedily (in episodes, with tools, for a
    task with tools)."""
    if task.tools:
        from rlhfkit.demo import tool_use

        return tool_use.greedy_accuracy(model, tokenizer, task, data, cfg.response_length)
    greedy = sample_completions(model, tokenizer, data["prompt"], cfg.response_length, 1.0, 0, 256, True)
    return sum(task.reward(greedy.texts, answer=data["answer"])) / len(data)


def _sft_setup(cfg: DemoConfig, task: Task) -> tuple[Any, dict[str, Any]]:
    """The SFT data and loss settings: problem/answer pairs with a completion-only loss, or for a task with
    tools `SFT_TRANSCRIPTS` conversations trained on the assistant's turns only (never a tool's result)."""
    if task.tools:
        from rlhfkit.demo.tool_use import SFT_TRANSCRIPTS

        data = task.sft_dataset(n=SFT_TRANSCRIPTS, seed=cfg.seed)
        return data, {"assistant_only_loss": True, "max_seq_length": 128}
    return task.sft_dataset(seed=cfg.seed), {"completion_only_loss": True, "max_seq_length": 32}


def train_sft(cfg: DemoConfig, task: Task, base: StageResult, out: Path) -> dict[str, Any]:
    """Next-token training on train problems, one problem per row; with `sft_target_accuracy` it stops
    early once the policy answers that share of train problems."""
    from rlhfkit.trainers.sft.config import SFTConfig
    from rlhfkit.trainers.sft.trainer import SFTTrainer

    tokenizer = stages.load_tokenizer(base.path)
    if task.chat_template:  # saved with the SFT policy: the later stages render prompts with it
        tokenizer.chat_template = task.chat_template
    data, loss_settings = _sft_setup(cfg, task)
    args = SFTConfig(
        **loss_settings,
        per_device_train_batch_size=cfg.sft_batch_size,
        max_steps=cfg.sft_steps,
        learning_rate=cfg.sft_learning_rate,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=0.1,
        logging_steps=PROBE_EVERY,  # the run may stop long before sft_steps: log often enough to plot
        **stages.trainer_defaults(cfg, out),
    )
    probe = ProbeLog()
    near_every = None
    if task.tools:
        from rlhfkit.demo.tool_use import SFT_PROBE_NEAR_EVERY as near_every
    callbacks = (
        [_stop_at_accuracy(cfg, task, tokenizer, probe, near_every)] if cfg.sft_target_accuracy else []
    )
    trainer = SFTTrainer(
        model=str(base.path),
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    result = trainer.train()
    trainer.model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    history = stages._save_logs(trainer, out)
    losses = [h["loss"] for h in history if "loss" in h]
    went_back = probe.kept_step is not None
    summary = {
        "steps": probe.kept_step if went_back else result.global_step,
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "train_probe_accuracy": probe.kept_accuracy if went_back else (probe.accuracies or [None])[-1],
    }
    if near_every is not None:  # the whole probe curve: where the skill appeared, what was kept
        summary.update(
            trained_steps=result.global_step, probe_steps=probe.steps, probe_accuracy=probe.accuracies
        )
    return summary


# ---------------------------------------------------------------------- 3. GRPO on the exact reward
def _reward_bar(progress: Any, total: int) -> Any:
    """A callback driving one progress bar that shows the latest mean reward (the trainer itself stays
    quiet)."""
    from transformers import TrainerCallback

    bar = progress.add_task("GRPO steps", total=total)

    class RewardBar(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                description = f"GRPO steps  reward={logs['reward']:.3f}"
                progress.update(bar, completed=state.global_step, description=description)

    return RewardBar()


def train_grpo(cfg: DemoConfig, task: Task, sft: StageResult, out: Path) -> dict[str, Any]:
    """GRPO from the SFT policy on train problems; the reward function reads the "answer" column."""
    from rich.progress import Progress
    from transformers import PrinterCallback

    from rlhfkit import GRPOConfig, GRPOTrainer

    tokenizer = stages.load_tokenizer(sft.path)
    tool_settings, tools = {}, {}
    if task.tools:  # episodes: the model calls the tools, reads their results, answers
        from rlhfkit.demo.tool_use import MAX_TOOL_ITERATIONS, TOOL_TIMEOUT

        tool_settings = {"max_tool_calling_iterations": MAX_TOOL_ITERATIONS, "tool_timeout": TOOL_TIMEOUT}
        tools = {"tools": list(task.tools)}
    args = GRPOConfig(
        per_device_train_batch_size=cfg.rl_batch_size,
        num_generations=cfg.num_generations,
        max_steps=cfg.rl_updates,
        logging_steps=1,
        num_iterations=cfg.rl_epochs,
        beta=cfg.kl_coef,
        max_completion_length=cfg.response_length,
        **tool_settings,
        **{**stages.online_rl_defaults(cfg, out), "disable_tqdm": True},  # one bar below, not a log per step
    )
    trainer = GRPOTrainer(
        model=str(sft.path),
        reward_funcs=task.reward,
        args=args,
        train_dataset=task.prompt_dataset("train", seed=cfg.seed),
        processing_class=tokenizer,
        **tools,
    )
    trainer.remove_callback(PrinterCallback)  # with tqdm off, transformers would print every log
    with Progress() as progress:
        trainer.add_callback(_reward_bar(progress, cfg.rl_updates))
        result = trainer.train()
    trainer.model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    shutil.rmtree(out / "trainer", ignore_errors=True)
    history = [dict(h) for h in trainer.state.log_history]
    (out / "log_history.json").write_text(json.dumps(history, indent=1, default=float), encoding="utf-8")
    logged = [h for h in history if "reward" in h]
    curves = {"step": [h["step"] for h in logged], "reward": [h["reward"] for h in logged]}
    if task.tools:
        curves["tool_calls"] = [h.get("tools/call_frequency") for h in logged]
    (out / "curves.json").write_text(json.dumps(curves, indent=1), encoding="utf-8")
    head, tail = curves["reward"][:5], curves["reward"][-5:]
    return {
        "steps": result.global_step,
        "reward_start": sum(head) / max(1, len(head)),
        "reward_end": sum(tail) / max(1, len(tail)),
    }


# ---------------------------------------------------------------------- 4. held-out accuracy
def _accuracy(metrics: dict[str, Any], key: str, rewards: list[float]) -> None:
    """`key`: the share of exact answers; `key`_ci95: its 95% Wilson interval (rounded for reading)."""
    correct = int(sum(rewards))
    metrics[key] = correct / len(rewards)
    metrics[f"{key}_ci95"] = [
        round(bound, 4) for bound in wilson_interval(correct / len(rewards), len(rewards))
    ]


def evaluate(cfg: DemoConfig, task: Task, sft: StageResult, rl: StageResult, out: Path) -> dict[str, Any]:
    """Greedy and sampled accuracy of the SFT and GRPO policies on held-out problems; samples.jsonl.
    A task with tools is measured in episodes, with and without them (`tool_use.evaluate`)."""
    if task.tools:
        from rlhfkit.demo import tool_use

        return tool_use.evaluate(cfg, task, sft, rl, out)
    tokenizer = stages.load_tokenizer(sft.path)
    held_out = task.prompt_dataset("test", n=cfg.eval_num_prompts, seed=cfg.seed)
    prompts, answers = held_out["prompt"], held_out["answer"]
    metrics: dict[str, Any] = {"task": task.name, "num_prompts": len(prompts)}
    texts: dict[str, list[str]] = {}
    for name, stage in (("sft", sft), ("rl", rl)):
        policy = stages.load_policy(stage.path)
        greedy = sample_completions(policy, tokenizer, prompts, cfg.response_length, 1.0, cfg.seed, 256, True)
        sampled = sample_completions(
            policy, tokenizer, prompts, cfg.response_length, cfg.temperature, cfg.seed + 1000, 256
        )
        texts[name] = greedy.texts
        _accuracy(metrics, f"greedy_{name}", task.reward(greedy.texts, prompts=prompts, answer=answers))
        _accuracy(metrics, f"sampled_{name}", task.reward(sampled.texts, prompts=prompts, answer=answers))
    metrics["lift_points"] = 100 * (metrics["greedy_rl"] - metrics["greedy_sft"])
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    with open(out / "samples.jsonl", "w", encoding="utf-8") as fh:
        for i, (prompt, answer) in enumerate(zip(prompts, answers)):
            row = {"prompt": prompt, "answer": answer, "sft": texts["sft"][i], "rl": texts["rl"][i]}
            fh.write(json.dumps(row) + "\n")
    return metrics


# ---------------------------------------------------------------------- the pipeline
def run_verifiable_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Base -> SFT warm start -> GRPO -> held-out accuracy, each stage cached; writes the report."""
    from rlhfkit.demo import tool_use, verifiable_report
    from rlhfkit.demo.report import write_files

    task = get_task(cfg.task)
    task_report = tool_use if task.tools else verifiable_report
    settings = tool_use.stage_settings() if task.tools else {}
    demo = runner.begin(cfg)
    run, console, root, results = demo.run, demo.console, demo.root, demo.results

    name = task.name
    run("base", Stage("base", "1/4 base model", cfg.values("model"), lambda out: stages.build_base(cfg, out)))
    chain = (  # key, stage folder, title, the config fields it depends on, what it runs, the stages it reads
        ("sft", f"sft-{name}", f"2/4 SFT warm start ({name})", SFT_FIELDS, train_sft, ("base",)),
        ("rl", f"rl-grpo-{name}", "3/4 GRPO on the exact reward", GRPO_FIELDS, train_grpo, ("sft",)),
        ("evaluation", f"evaluation-{name}", "4/4 held-out accuracy", EVAL_FIELDS, evaluate, ("sft", "rl")),
    )
    for key, folder, title, fields, compute, reads in chain:
        parents = [results[k] for k in reads]  # compute(cfg, task, *parents, out)
        config = {**cfg.values(*fields), **settings}
        run(key, Stage(folder, title, config, partial(compute, cfg, task, *parents), parents))
    evaluated = results["evaluation"]
    samples = [
        json.loads(line) for line in (evaluated.path / "samples.jsonl").read_text("utf-8").splitlines()
    ]
    task_report.print_samples(samples[: cfg.eval_samples_shown], console)
    lines = task_report.result_lines(cfg, task.description, results), task_report.sample_lines(cfg, samples)
    plotted = partial(verifiable_report.make_plots, root, results)
    metrics = write_files(cfg, root, results, demo.seconds(), plotted, *lines)
    ev = metrics["evaluation"]
    console.print(
        f"[bold]held-out greedy accuracy: SFT {100 * ev['greedy_sft']:.1f}% -> GRPO "
        f"{100 * ev['greedy_rl']:.1f}% ({ev['lift_points']:+.1f} points)[/]; report: {root / 'report.md'}"
    )
    return metrics
