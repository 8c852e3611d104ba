"""The Trainer integration every online RL trainer (RLOO, GRPO) shares: one loop, the algorithm in two hooks.

`OnlineTrainerLoop.train` prepares the model and optimizer, resumes from a verified checkpoint, then runs
one update at a time: `_rollout(update)` samples and scores (returns a `RolloutBatch` and its metrics),
`_optimize(model, batch)` takes the gradient steps (returns their metrics). Between updates it steps the
scheduler, logs, saves and shows sample completions, with the callbacks Trainer users expect.

A trainer names its sizes through `_num_updates()` and `_episodes_per_update()`, the key of its logged loss
in `_loss_metric`, and its model card in `_model_card_lines()`. State that must survive a resume besides
Trainer's own (e.g. a buffer of generated completions) goes through `_loop_state` / `_load_loop_state`,
saved per process next to the RNG state. With `args.health_checks`, each update's metrics pass through the
health alarms (`rlhfkit.trainers.common.health`) under the names of `TRAINER_METRICS[_health_metrics]`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import TrainerState
from transformers.trainer_utils import TrainOutput

from rlhfkit.rollout import GenerationBackend, forward_response, make_generation_backend, pad_left
from rlhfkit.rollout.backends import ENGINE_BACKENDS
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.rollout.host_memory import fix_mmap_threshold, release_free_heap
from rlhfkit.trainers.common.checkpointing import load_state, save_state
from rlhfkit.trainers.common.engine_sync import engine_options, sync_engine
from rlhfkit.trainers.common.health import HealthMonitor, monitor_for, watch, watch_judge
from rlhfkit.trainers.common.progress import print_sample_table, save_samples, text_writer
from rlhfkit.trainers.common.sharding import sharded_generation_context

LOOP_STATE_NAME = "online_loop_state"  # <name>_<rank>.json + .safetensors in each checkpoint
HEALTH_STATE_NAME = "health_monitor"  # the health alarms' history (.json + .safetensors), one per checkpoint


class OnlineTrainerLoop:
    """Put before `RobustTrainerMixin, Trainer` in an online trainer's bases; see the module docstring."""

    _loss_metric = "loss"
    _health_metrics: str | None = None  # the trainer's key in `health.TRAINER_METRICS`
    # end with transformers' summary entry (train_loss, train_runtime, ...): TRL 1.x's trainers do, TRL 0.x's
    # RLOO did not
    _summary_log = False
    # run `evaluate()` when the Trainer's evaluation schedule (eval_strategy, eval_steps) says so
    _evaluates = False
    health: HealthMonitor | None = None  # built by train(); set one first for other thresholds

    # ------------------------------------------------------------------ hooks
    def _rollout(self, update: int) -> tuple[RolloutBatch, dict[str, float]]:
        raise NotImplementedError

    def _optimize(self, model: nn.Module, batch: RolloutBatch) -> dict[str, float]:
        raise NotImplementedError

    def _num_updates(self) -> int:
        raise NotImplementedError

    def _episodes_per_update(self) -> int:
        raise NotImplementedError

    def _sample_generations_freq(self) -> int:
        """Updates between two tables of greedy sample completions (0: never)."""
        return 0

    def _forward_chunk_size(self) -> int:
        """Rows per no-gradient forward pass over a rollout (reference logprobs, reward models)."""
        raise NotImplementedError

    def _model_card_lines(self) -> list[str]:
        """The algorithm's part of the model card: what it is, its main settings, its reference."""
        return []

    def _loop_state(self) -> dict[str, Any] | None:
        """Extra per-process state a resumed run needs (tensors, numbers, containers), or None."""
        return None

    def _load_loop_state(self, state: dict[str, Any]) -> None:
        """Restore what `_loop_state` returned."""

    # ------------------------------------------------------------------ training loop
    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trust_unverified_checkpoint: bool = False,
        **kwargs: Any,
    ) -> TrainOutput:
        """Train; `trust_unverified_checkpoint=True` resumes from a folder without a manifest (warned)."""
        args = self.args
        # the output folder's lock and the checkpoint's checks come before any work
        checkpoint = self._begin_run(resume_from_checkpoint, trust_unverified_checkpoint)
        fix_mmap_threshold()  # freed (batch, vocab) sampling blocks go back to the OS
        num_updates = self._num_updates()
        if args.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs
            )
        self.create_optimizer_and_scheduler(num_training_steps=num_updates)
        model, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)
        self.model_wrapped = model
        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(),
            is_world_process_zero=self.is_world_process_zero(),
            stateful_callbacks=dict(self.state.stateful_callbacks),
        )
        if self.health is None and args.health_checks and self._health_metrics:
            # before resuming: the checkpoint holds its history
            self.health = monitor_for(self._health_metrics)
        self._resume(checkpoint)
        self._connect_engine()  # an unreachable or mismatched engine fails here, before any update
        per_update = self._episodes_per_update()
        self.state.max_steps = num_updates
        # a streamed dataset has no length: one "epoch" is then the whole run
        rows = len(self.train_dataset) if hasattr(self.train_dataset, "__len__") else num_updates * per_update
        self.state.num_train_epochs = math.ceil(num_updates * per_update / rows)
        self.state.compute_steps(args, num_updates)
        self.state.train_batch_size = args.per_device_train_batch_size
        self.is_in_train = True
        model.train()
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        start_time, start_update, losses = time.time(), self.state.global_step, []
        unlogged: list[dict[str, float]] = []  # the updates since the last log entry

        with self.graceful_stop:  # SIGINT/SIGTERM: finish the update, save, stop
            for update in range(start_update, num_updates):
                self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
                batch, metrics = self._rollout(update)
                # before the optimizer's moments and gradients join the rollout's leftovers
                release_free_heap(model, len(batch.responses))
                metrics.update(self._optimize(model, batch))
                metrics["lr"] = self.lr_scheduler.get_last_lr()[0]
                self.lr_scheduler.step()
                self.state.global_step += 1
                episodes = self.state.global_step * per_update
                self.state.epoch = episodes / rows
                metrics["eps"] = int(
                    (self.state.global_step - start_update) * per_update / (time.time() - start_time)
                )
                metrics["episode"] = episodes
                metrics.update(
                    watch(self.health, metrics, self.state.global_step, self.is_world_process_zero())
                )
                losses.append(metrics[self._loss_metric])
                self.control = self.callback_handler.on_step_end(args, self.state, self.control)
                if self.control.should_log:
                    self.log(metrics)
                    self.control.should_log = False
                    unlogged.clear()
                else:
                    unlogged.append(metrics)
                self._after_update(model)
                if self.control.should_training_stop:
                    break

        mean_loss = float(sum(losses) / len(losses)) if losses else 0.0
        if self._summary_log:
            updates = self.state.global_step - start_update
            self.log(self._summary(time.time() - start_time, updates, mean_loss, unlogged))
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        self.is_in_train = False
        return TrainOutput(self.state.global_step, mean_loss, {"train_loss": mean_loss})

    def _after_update(self, model: nn.Module) -> None:
        """What the Trainer's schedule asks for after an update: evaluation, a checkpoint, sample tables."""
        if self.control.should_evaluate and self._evaluates:
            self.evaluate()
            self.control.should_evaluate = False
        if self.control.should_save:
            self._save_checkpoint(model, trial=None)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)
        freq = self._sample_generations_freq()
        if freq and self.state.global_step % freq == 0:
            self.generate_completions()

    def _summary(
        self, seconds: float, updates: int, mean_loss: float, unlogged: list[dict[str, float]]
    ) -> dict[str, float]:
        """The run's last log entry, as transformers' Trainer writes it: speed and the mean loss; as in TRL's
        trainers, also the metrics of the `unlogged` updates since the last entry, averaged."""
        seconds = max(seconds, 1e-9)
        return {
            **mean_metrics(unlogged),
            "train_runtime": round(seconds, 4),
            "train_samples_per_second": round(updates * self._episodes_per_update() / seconds, 3),
            "train_steps_per_second": round(updates / seconds, 3),
            "train_loss": mean_loss,
        }

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """Trainer's log; a judge's win rate logged on its own (by a callback) reaches the health alarms
        too."""
        logs = {
            **logs,
            **watch_judge(self.health, logs, self.state.global_step, self.is_world_process_zero()),
        }
        super().log(logs, *args, **kwargs)

    def _resume(self, folder: Path | None) -> None:
        """Load weights, optimizer, scheduler, Trainer state and RNG of the checkpoint `_begin_run` found and
        verified (None: a fresh run)."""
        if folder is None:
            return
        checkpoint = str(folder)
        self._load_from_checkpoint(checkpoint)
        self._load_optimizer_and_scheduler(checkpoint)
        self.state = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
        self._load_rng_state(checkpoint)

    def _save_rng_state(self, output_dir: str) -> None:
        """Trainer's per-process RNG file, plus this trainer's `_loop_state` (written only when it has
        one)."""
        super()._save_rng_state(output_dir)
        state = self._loop_state()
        if state is not None:
            save_state(output_dir, f"{LOOP_STATE_NAME}_{self.accelerator.process_index}", state)
        if self.health is not None and self.args.should_save:  # every process's monitor saw the same metrics
            save_state(output_dir, HEALTH_STATE_NAME, self.health.state_dict())

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        name = f"{LOOP_STATE_NAME}_{self.accelerator.process_index}"
        if checkpoint is not None and os.path.isfile(os.path.join(checkpoint, f"{name}.json")):
            self._load_loop_state(load_state(checkpoint, name))
        health = None if checkpoint is None else os.path.join(checkpoint, f"{HEALTH_STATE_NAME}.json")
        if self.health is not None and health is not None and os.path.isfile(health):
            self.health.load_state_dict(load_state(checkpoint, HEALTH_STATE_NAME))

    # ------------------------------------------------------------------ rollout helpers
    def _reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """(N, R) logprobs of the responses under the reference (junk on padding: mask it)."""
        with self.reference(self.accelerator.unwrap_model(self.model)) as ref_policy:
            parts = [
                forward_response(ref_policy, *chunk, temperature=self.args.temperature).logprobs
                for chunk in self._forward_chunks(batch)
            ]
        return torch.cat(parts)

    @torch.no_grad()
    def _policy_logprobs_now(self, batch: RolloutBatch) -> torch.Tensor:
        """(N, R) the current policy's logprobs of the responses, for sampling that streams none (beam
        search scores beams, not tokens)."""
        policy = self.accelerator.unwrap_model(self.model)
        parts = [
            forward_response(policy, *chunk, temperature=self.args.temperature).logprobs
            for chunk in self._forward_chunks(batch)
        ]
        return torch.cat(parts)

    def _forward_chunks(self, batch: RolloutBatch) -> Iterator[tuple[torch.Tensor, ...]]:
        """(query_ids, query_mask, responses, response_mask) of `_forward_chunk_size()` rows at a time.

        The queries keep the batch's width: `batch[rows]` would trim their shared left padding, which moves
        logprobs and scores in the last float bits; kept so that a seed reproduces earlier runs exactly.
        """
        size = self._forward_chunk_size()
        for start in range(0, len(batch), size):
            rows = slice(start, start + size)
            yield (
                batch.query_ids[rows],
                batch.query_mask[rows],
                batch.responses[rows],
                batch.response_mask[rows],
            )

    def _gathered_weights(self) -> contextlib.AbstractContextManager:
        """Under DeepSpeed ZeRO-3, the policy's sharded weights gathered once per generation (unless told
        not to)."""
        return sharded_generation_context(self.accelerator, self.model, self.args.ds3_gather_for_generation)

    def _sampler(self, chunk_size: int | None = None) -> GenerationBackend:
        """The generation backend over the current policy (weights gathered under ZeRO-3); an inference
        engine's (use_vllm) is made once and holds the policy's latest weights."""
        engine, options = self.args.generation_engine()
        if engine in ENGINE_BACKENDS:
            return self._engine_sampler()
        return make_generation_backend(
            self.accelerator.unwrap_model(self.model),
            self.processing_class.pad_token_id,
            engine=engine,
            chunk_size=chunk_size,
            weights_context=self._gathered_weights,
            options=options,
        )

    def _connect_engine(self) -> None:
        """With an inference engine (use_vllm): connect, check and sync it now."""
        if self.args.generation_engine()[0] in ENGINE_BACKENDS:
            self._engine_sampler()

    def _engine_sampler(self) -> GenerationBackend:
        """The inference engine's backend: connected (and checked) on the first call, which `train` makes
        before any update, then given the policy's weights whenever an optimizer step changed them (by the
        main process, the others waiting: `engine_sync`)."""
        if getattr(self, "_engine", None) is None:
            engine, options = self.args.generation_engine()
            options = engine_options(engine, options, self.accelerator, self.processing_class)
            self._engine = make_generation_backend(
                self.accelerator.unwrap_model(self.model),
                self.processing_class.pad_token_id,
                engine=engine,
                weights_context=self._gathered_weights,
                options=options,
            )
            self._engine_step = None  # the engine serves the checkpoint on disk, not necessarily the policy
        if self._engine_step != self.state.global_step:
            sync_engine(self._engine, self.accelerator.unwrap_model(self.model), self.accelerator)
            self._engine_step = self.state.global_step
        return self._engine

    def _pad_prompts(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-id lists, left-padded and on this process's device: (query_ids, query_mask), each (B, Q)."""
        ids, mask = pad_left(
            [torch.tensor(r, dtype=torch.long) for r in rows], self.processing_class.pad_token_id
        )
        return ids.to(self.accelerator.device), mask.to(self.accelerator.device)

    def _decode(self, queries: torch.Tensor, responses: torch.Tensor, response_mask: torch.Tensor):
        tok = self.processing_class
        prompts = tok.batch_decode(queries, skip_special_tokens=True)
        completions = [
            tok.decode(r[m], skip_special_tokens=True) for r, m in zip(responses, response_mask.bool())
        ]
        return prompts, completions

    @torch.no_grad()
    def generate_completions(self) -> dict[str, list] | dict[str, dict[str, list]]:
        """Greedy completions of the first `num_sample_prompts` evaluation prompts: printed and saved.

        With a dict of evaluation datasets, one table per dataset, saved under `output_dir/samples-<name>`,
        and the samples are returned by name.
        """
        if isinstance(self.eval_dataset, dict):
            return {
                name: self._sample_completions(
                    dataset, f" ({name})", os.path.join(self.args.output_dir, f"samples-{name}")
                )
                for name, dataset in self.eval_dataset.items()
            }
        dataset = self.eval_dataset if self.eval_dataset is not None else self.train_dataset
        return self._sample_completions(dataset, "", self.args.output_dir)

    def _sample_completions(self, dataset: Any, label: str, folder: str) -> dict[str, list]:
        args = self.args
        rows = dataset.select(range(min(args.num_sample_prompts, len(dataset))))["input_ids"]
        queries, masks = self._pad_prompts(rows)
        greedy = dataclasses.replace(self.sampling_params, do_sample=False)
        out = self._sampler().generate(queries, masks, greedy)
        responses, response_mask = out.responses, out.response_mask
        prompts, completions = self._decode(queries, responses, response_mask)
        scores, _ = self.scorer(queries, masks, responses, response_mask, prompts, completions)
        samples = {"query": prompts, "model response": completions, "score": scores.tolist()}
        if self.is_world_process_zero():
            step = self.state.global_step
            print_sample_table(
                prompts, completions, samples["score"], title=f"sample completions{label}, update {step}"
            )
            table = os.path.basename(folder) if label else "samples"  # samples-<eval set name>
            save_samples(
                folder, step, prompts, completions, samples["score"], table=table, writer=text_writer(self)
            )
        return samples

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
    ) -> None:
        """Write a short README.md model card into output_dir."""
        if not self.is_world_process_zero():
            return
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        tags = list(dict.fromkeys(tags + self._tag_names))
        base = getattr(getattr(self.model, "config", None), "_name_or_path", None) or "unknown"
        what, *details = self._model_card_lines()
        lines = [
            "---",
            "library_name: transformers",
            "tags:",
            *[f"- {t}" for t in tags],
            "---",
            "",
            f"# {model_name or os.path.basename(os.path.normpath(self.args.output_dir))}",
            "",
            f"Fine-tuned from `{base}` with {what} using rlhfkit"
            + (f" on the `{dataset_name}` dataset." if dataset_name else "."),
            "",
            *details,
            "",
        ]
        os.makedirs(self.args.output_dir, exist_ok=True)
        with open(os.path.join(self.args.output_dir, "README.md"), "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines))


def mean_metrics(entries: list[dict[str, float]]) -> dict[str, float]:
    """Each numeric metric's mean over `entries` (those that have it): the updates after the last logged
    one, which the run's summary entry carries so that no update's metrics go unlogged (as TRL does)."""
    values: dict[str, list[float]] = {}
    for entry in entries:
        for key, value in entry.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values.setdefault(key, []).append(float(value))
    return {key: sum(v) / len(v) for key, v in values.items()}
