"""Saving a PPO run: the trained policy (`save_pretrained`, `push_to_hub`, a model card) and resumable
checkpoints (`save_checkpoint` / `load_checkpoint`, through `trainers.common.checkpointing`).

Under FSDP each rank holds shards: every rank takes part in gathering whole tensors (weights, and the
optimizer's state keyed by parameter name), and the main process writes them, in the same files as an
unsharded run, so a plain single-process model loads them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlhfkit.trainers.common.checkpointing import (
    WEIGHTS_FILE,
    load_training_checkpoint,
    save_training_checkpoint,
)
from rlhfkit.trainers.common.resuming import PPO_WATCHED, check_resume_settings, write_training_settings
from rlhfkit.trainers.common.sharding import gather_optimizer_state, load_optimizer_state, shard_like
from rlhfkit.trainers.ppo import stats as ppo_stats


class SavingMethods:
    """Mixed into `PPOTrainer`.

    Relies on its `accelerator`, `policy`, `tokenizer`, `config` and step state.
    """

    def save_pretrained(self, save_directory: str) -> None:
        """Policy (with value head), tokenizer and a model card, into `save_directory`.

        Like transformers' save_pretrained, other files in the folder are left alone (use
        `save_checkpoint` for atomic, resumable snapshots).
        """
        self.accelerator.wait_for_everyone()
        full = self._gathered_weights()
        if self.accelerator.is_main_process:
            self._write_pretrained(save_directory, full)

    save_model = save_pretrained

    def _gathered_weights(self) -> dict[str, Any] | None:
        """Under FSDP, the policy's whole tensors (a collective: call on every rank; only the main process
        gets them, on the CPU); None when the policy is not sharded."""
        return self.accelerator.get_state_dict(self._train_model) if self._fsdp else None

    def _write_pretrained(self, save_directory: str, state_dict: dict[str, Any] | None = None) -> None:
        Path(save_directory).mkdir(parents=True, exist_ok=True)
        self.policy.save_pretrained(
            save_directory, **({} if state_dict is None else {"state_dict": state_dict})
        )
        self.tokenizer.save_pretrained(save_directory)
        self.create_model_card(save_directory)

    def push_to_hub(
        self,
        repo_id: str,
        *,
        commit_message: str = "Upload model trained with rlhfkit PPOTrainer",
        private: bool | None = None,
        token: str | None = None,
        branch: str | None = None,
        create_pr: bool = False,
    ) -> Any:
        """Upload what `save_pretrained` writes (policy with value head, tokenizer, model card) to the Hub
        repo `repo_id` in one commit, creating the repo if needed. Needs network access: offline
        (`HF_HUB_OFFLINE=1`) it raises before writing anything; `save_pretrained(folder)` is the offline way.
        Returns the commit info on the main process, None elsewhere."""
        import tempfile

        from huggingface_hub import HfApi, constants

        if not isinstance(repo_id, str) or not repo_id.strip():
            raise ValueError(f"repo_id must be a Hub repository name such as 'user/model', got {repo_id!r}")
        if constants.HF_HUB_OFFLINE:
            raise RuntimeError(
                f"push_to_hub({repo_id!r}) needs network access but HF_HUB_OFFLINE is set; save locally with "
                "trainer.save_pretrained(folder) and upload that folder later"
            )
        self.accelerator.wait_for_everyone()
        full = self._gathered_weights()
        if not self.accelerator.is_main_process:
            return None
        api = HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True)
        with tempfile.TemporaryDirectory() as folder:
            self._write_pretrained(folder, full)
            return api.upload_folder(
                repo_id=repo_id,
                folder_path=folder,
                commit_message=commit_message,
                revision=branch,
                create_pr=create_pr,
            )

    def create_model_card(self, path: str, model_name: str | None = "rlhfkit Model") -> None:
        """Write README.md into `path`: what was trained, on what, and how to load it."""
        Path(path, "README.md").write_text(self._model_card(path, model_name))

    def _model_card(self, path: str, model_name: str | None) -> str:
        base = self.config.model_name or getattr(self.policy.config, "_name_or_path", "") or "unknown"
        return ppo_stats.MODEL_CARD.format(
            model_name=model_name,
            task_name=self.config.task_name or "custom",
            steps=self.current_step,
            base_model=base,
            path=path,
        )

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Everything a resumed run needs, written atomically and with checksums (`checkpointing`).

        That is: weights (incl. value head), optimizer, scheduler, KL controller, running score moments,
        the health alarms' history, each process's RNG state and step counter, and the settings a resumed
        run is compared with (`resuming.PPO_WATCHED`). Call it on every process.
        """
        self.accelerator.wait_for_everyone()
        weights, extra = self._gathered_weights(), None
        if (
            self._fsdp
        ):  # the optimizer's state is sharded too (`_checkpoint_parts` leaves it out): gathered alike
            extra = {"optimizer": gather_optimizer_state(self._train_model, self.optimizer)}
        save_training_checkpoint(
            checkpoint_dir,
            self.current_step,
            self.policy if weights is None else weights,
            self._checkpoint_parts(),
            extra=extra,
            settings=lambda folder: write_training_settings(folder, self.config, PPO_WATCHED, "steps"),
        )  # every rank adds its random state
        self.checkpoint_dir = str(checkpoint_dir)

    def load_checkpoint(self, checkpoint_dir: str, trust_unverified_checkpoint: bool = False) -> None:
        """Restore a `save_checkpoint` folder (or the newest intact `checkpoint-<step>` in a folder);
        `trust_unverified_checkpoint=True` loads one without a manifest (warned). A `ResumeSettingsWarning`
        names each setting (batch sizes, epochs, learning rate, seed) that differs from the checkpoint's
        run."""
        from safetensors.torch import load_file, load_model

        folder, state = load_training_checkpoint(
            checkpoint_dir, self._checkpoint_parts(), trust_unverified_checkpoint=trust_unverified_checkpoint
        )
        check_resume_settings(folder, self.config, watched=PPO_WATCHED)
        if self._fsdp:  # every rank reads the whole tensors and keeps its own shard of them (not torch's
            # set_model_state_dict or accelerate's loader: they do not expect the value head's key layout)
            whole = load_file(str(folder / WEIGHTS_FILE))
            self.policy.load_state_dict(shard_like(self.policy.state_dict(), whole))
            load_optimizer_state(self._train_model, self.optimizer, state["optimizer"])
        else:
            device = self.current_device  # safetensors takes "cpu", not the "cpu:0" of a multi-CPU run
            load_model(
                self.policy, str(folder / WEIGHTS_FILE), device="cpu" if device.type == "cpu" else str(device)
            )
        self.current_step = int(state["step"])
        self.policy_version += 1

    def _checkpoint_parts(self) -> dict[str, Any]:
        return {
            "optimizer": None if self._fsdp else self.optimizer,
            "lr_scheduler": self.lr_scheduler,
            "kl_ctl": self.kl_ctl,
            "running": self.running,
            "health": self.health,
        }  # health: None when off
