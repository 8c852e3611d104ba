"""Win rate during training: every N steps, the policy against a fixed reference on held-out prompts.

`WinRateCallback` samples the same held-out prompts from the policy and from the reference (a frozen
snapshot of the starting policy unless one is given), asks a pairwise judge which completion of each pair
is better, and logs `eval/win_rate` with its 95% Wilson interval (`eval/win_rate_low`/`_high`, ties count
half: `rlhfkit.judges.win_rate`). The judged pairs are appended to `samples.jsonl` as table "win_rate".

It is a `transformers.TrainerCallback` for the Trainer-based trainers (RLOO, GRPO, DPO, SFT, Reward) and
logs through `trainer.log`, so trackers and other callbacks see it; `PPOTrainer` has no loop of its own,
so its users call `on_ppo_step` after `step()` and merge the returned metrics into `log_stats`.

Runs on the main process only: the others go on and wait for it at their next collective (so not under
ZeRO-3 or FSDP, where no process holds the whole weights). The RNG is forked while sampling, so a run
trains the same with and without the callback. A trainer with `use_vllm` lends its engine for the
policy's completions; the reference's are sampled in-process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from transformers import TrainerCallback

from rlhfkit.judges import TIE, BaseJudge, win_rate
from rlhfkit.models.reference import Reference, choose_reference
from rlhfkit.rollout import SamplingParams, make_generation_backend, pad_left
from rlhfkit.trainers.common.progress import save_samples, text_writer

OUTCOMES = {1: ("win", 1.0), 0: ("loss", 0.0), TIE: ("tie", 0.5)}  # judgement of [reference, policy] pairs


class WinRateCallback(TrainerCallback):
    """Logs the policy's win rate against a fixed reference every `every_n_steps` steps.

    `judge`: a pairwise judge (`rlhfkit.judges`). `prompts`: held-out prompt strings (default: the
    trainer's `eval_dataset["prompt"]`), the first `num_prompts` of them judged each time. `trainer`: the
    trainer to log through (TRL's usage: create the callback after the trainer, then
    `trainer.add_callback(callback)`); given, the reference is snapshotted at once, before any resume.
    `reference_model`: the fixed opponent; None takes one from the policy with `choose_reference` (a
    frozen copy, or for a PEFT policy its reference adapter or adapter-disabled base). `sampling_params`:
    how both sample (default: greedy, `max_new_tokens`, stopping at the tokenizer's eos); `seed` seeds
    sampling at each evaluation. `output_dir`: where samples.jsonl goes (default: the trainer's).
    """

    def __init__(
        self,
        judge: BaseJudge,
        prompts: Sequence[str] | None = None,
        *,
        trainer: Any = None,
        every_n_steps: int = 100,
        reference_model: torch.nn.Module | None = None,
        num_prompts: int | None = None,
        max_new_tokens: int = 64,
        sampling_params: SamplingParams | None = None,
        tokenizer: Any = None,
        batch_size: int = 16,
        seed: int = 0,
        shuffle_order: bool = True,
        output_dir: str | None = None,
    ):
        if not callable(getattr(judge, "judge", None)):
            raise TypeError(
                f"judge must be a pairwise judge with a judge() method, got {type(judge).__name__}"
            )
        for name, value in (
            ("every_n_steps", every_n_steps),
            ("batch_size", batch_size),
            ("max_new_tokens", max_new_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if num_prompts is not None and (
            isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 1
        ):
            raise ValueError(f"num_prompts must be a positive integer or None, got {num_prompts!r}")
        if sampling_params is not None and not isinstance(sampling_params, SamplingParams):
            raise TypeError(
                f"sampling_params must be a rlhfkit SamplingParams, got {type(sampling_params).__name__}"
            )
        self.prompts = _held_out_prompts(prompts, trainer)[:num_prompts]
        self.judge, self.trainer, self.every_n_steps = judge, trainer, every_n_steps
        self.reference_model, self.tokenizer, self.batch_size = reference_model, tokenizer, batch_size
        self.max_new_tokens, self.sampling_params, self.seed = max_new_tokens, sampling_params, seed
        self.shuffle_order, self.output_dir = shuffle_order, output_dir
        self.reference: Reference | None = None
        if trainer is not None:
            self.reference = choose_reference(trainer.model, reference_model, argument="reference_model")

    # ------------------------------------------------------------------ Trainer callback
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.trainer is None:
            raise ValueError(
                "WinRateCallback needs the trainer it logs through: create it after the trainer with "
                "WinRateCallback(judge, prompts, trainer=trainer) and add it with trainer.add_callback(...)"
            )
        _check_unsharded(self.trainer.accelerator)
        if not callable(getattr(model, "generate", None)):
            raise TypeError(
                f"WinRateCallback samples from the policy, but {type(model).__name__} cannot generate"
            )
        if self.reference is None:
            self.reference = choose_reference(model, self.reference_model, argument="reference_model")

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if state.global_step % self.every_n_steps or not state.is_world_process_zero:
            return
        metrics = self.evaluate(model, processing_class, state.global_step, args.output_dir)
        # `Trainer.log` clears `should_log`; keep it, or this update's own metrics line would be dropped
        should_log = self.trainer.control.should_log
        self.trainer.log(dict(metrics))
        self.trainer.control.should_log = control.should_log = should_log

    # ------------------------------------------------------------------ PPOTrainer
    def on_ppo_step(self, ppo_trainer: Any = None, step: int | None = None) -> dict[str, float]:
        """Call after `PPOTrainer.step()`: the win-rate metrics when `step` (default: steps taken) is due,
        else {}.

        Merge the result into the stats given to `log_stats`: `stats.update(callback.on_ppo_step(trainer))`.
        Every process calls it; only the main one samples and gets the metrics.
        """
        trainer = ppo_trainer if ppo_trainer is not None else self.trainer
        if trainer is None:
            raise ValueError("on_ppo_step needs the PPOTrainer: pass it, or give trainer= to WinRateCallback")
        step = trainer.current_step if step is None else step
        if step % self.every_n_steps or not trainer.accelerator.is_main_process:
            return {}
        _check_unsharded(trainer.accelerator)
        if self.reference is None:  # the policy now: create the callback before the first step for the start
            self.reference = choose_reference(trainer.model, self.reference_model, argument="reference_model")
        folder = self.output_dir or trainer.accelerator.project_dir
        return self.evaluate(trainer.model, trainer.tokenizer, step, folder, trainer=trainer)

    # ------------------------------------------------------------------ the evaluation
    def evaluate(
        self, model: torch.nn.Module, tokenizer: Any, step: int, output_dir: str | None, trainer: Any = None
    ) -> dict[str, float]:
        """Sample policy and reference, judge the pairs, save them; returns the three `eval/win_rate*`
        metrics."""
        tokenizer = self.tokenizer if self.tokenizer is not None else tokenizer
        if tokenizer is None:
            raise ValueError(
                "WinRateCallback needs a tokenizer: pass tokenizer= or give the trainer a processing_class"
            )
        trainer = trainer if trainer is not None else self.trainer
        policy_texts, reference_texts = self._sample(model, tokenizer, step, _engine_of(trainer))
        pairs = [[ref, own] for ref, own in zip(reference_texts, policy_texts)]  # the policy is index 1
        judgements = self.judge.judge(list(self.prompts), pairs, shuffle_order=self.shuffle_order)
        rate, low, high = win_rate(judgements, model_index=1)
        outcomes = [OUTCOMES[int(j)] for j in judgements]
        folder = self.output_dir or output_dir
        if folder is not None:
            save_samples(
                folder,
                step,
                list(self.prompts),
                policy_texts,
                [score for _, score in outcomes],
                table="win_rate",
                columns={"reference_response": reference_texts, "judgement": [name for name, _ in outcomes]},
                writer=text_writer(trainer if trainer is not None else self.trainer),
            )
        return {"eval/win_rate": rate, "eval/win_rate_low": low, "eval/win_rate_high": high}

    def _sample(
        self, model: torch.nn.Module, tokenizer: Any, step: int, engine: Any = None
    ) -> tuple[list[str], list[str]]:
        """Completions of the held-out prompts by the policy and by the reference, in the same RNG state.

        `engine`: the trainer's inference-engine backend (use_vllm), which then samples the policy; the
        reference samples in-process, so that the engine keeps the policy's weights."""
        device = next(model.parameters()).device
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        ids, mask = pad_left(
            [torch.tensor(tokenizer(p)["input_ids"], dtype=torch.long) for p in self.prompts], pad_id
        )
        ids, mask = ids.to(device), mask.to(device)
        params = self.sampling_params or SamplingParams(
            self.max_new_tokens,
            do_sample=False,
            stop_token_ids=None if tokenizer.eos_token_id is None else (tokenizer.eos_token_id,),
        )
        if self.reference.model is not None:
            self.reference.model.to(device)
        texts = []
        for role in ("policy", "reference"):
            # the same seed for both: with sampling on, differences come from the weights, not the draw
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(self.seed + step)
                with (
                    self.reference(model) if role == "reference" else contextlib.nullcontext(model) as acting
                ):
                    sampler = (
                        engine
                        if engine is not None and role == "policy"
                        else make_generation_backend(acting, pad_id, chunk_size=self.batch_size)
                    )
                    out = sampler.generate(ids, mask, params)
            texts.append(
                [
                    tokenizer.decode(r[m], skip_special_tokens=True)
                    for r, m in zip(out.responses, out.response_mask)
                ]
            )
        return texts[0], texts[1]


def _engine_of(trainer: Any) -> Any:
    """The trainer's inference-engine backend, synced with its policy, when its config has use_vllm; else
    None. The settings are the trainer's: `args` (Trainer-based trainers) or `config` (PPOTrainer).

    Under several processes also None: the win rate runs on the main process alone, and a sync there
    would wait at a barrier the others do not reach; the policy then samples in-process."""
    settings = getattr(trainer, "args", None) or getattr(trainer, "config", None)
    if not getattr(settings, "use_vllm", False) or trainer.accelerator.num_processes > 1:
        return None
    return trainer._engine_sampler()


def _held_out_prompts(prompts: Sequence[str] | None, trainer: Any) -> list[str]:
    """The prompt strings to judge on: `prompts`, else the trainer's eval_dataset "prompt" column."""
    if prompts is None:
        dataset = getattr(trainer, "eval_dataset", None)
        if (
            dataset is None
            or isinstance(dataset, dict)
            or "prompt" not in getattr(dataset, "column_names", [])
        ):
            raise ValueError("prompts is required unless trainer= has an eval_dataset with a 'prompt' column")
        prompts = dataset["prompt"]
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, got a single str; wrap it in a list")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts is empty: give at least one held-out prompt")
    bad = [i for i, p in enumerate(prompts) if not isinstance(p, str)]
    if bad:
        raise TypeError(f"prompts must be strings; prompts[{bad[0]}] is {type(prompts[bad[0]]).__name__}")
    return prompts


def _check_unsharded(accelerator: Any) -> None:
    """Sampling on one process needs the whole weights there: refuse ZeRO-3 and FSDP with a clear error."""
    from accelerate.utils import DistributedType

    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if accelerator.distributed_type == DistributedType.FSDP or (
        plugin is not None and plugin.zero_stage == 3
    ):
        raise ValueError(
            "WinRateCallback samples on the main process alone, which needs unsharded weights: it does not "
            "run under DeepSpeed ZeRO-3 or FSDP"
        )
