"""Child process of test_resume_after_sigkill: trains one tiny run of a trainer, checkpointing every 2 steps.

python resume_worker.py NAME OUT full      # two fresh runs: OUT/a/final.safetensors, OUT/b/final.safetensors
python resume_worker.py NAME OUT kill      # SIGKILLs itself in the middle of step 3 (checkpoint-2 is on disk)
python resume_worker.py NAME OUT resume    # resumes OUT/cut from its latest checkpoint:
                                           # OUT/cut/final.safetensors
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parents[1] / "distributed" / "workers"))
torch.set_num_threads(1)

STEPS, SAVE_EVERY, KILL_IN = 4, 2, 3


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _hf_trainer(name: str, out: Path, kill: bool):
    from transformers import TrainerCallback

    class KillDuringStep(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step + 1 == KILL_IN:
                _die()

    save = dict(save_strategy="steps", save_steps=SAVE_EVERY)
    if name == "rloo":
        from rlhfkit.rewards import KeywordReward
        from rlhfkit.tasks import toy_prompt_dataset
        from rlhfkit.testing import tiny_model, tiny_tokenizer
        from rlhfkit.trainers.rloo.config import RLOOConfig
        from rlhfkit.trainers.rloo.trainer import RLOOTrainer

        torch.manual_seed(0)
        config = RLOOConfig(
            output_dir=str(out), report_to="none", use_cpu=True, per_device_train_batch_size=2, rloo_k=2,
            num_ppo_epochs=1, response_length=4, total_episodes=2 * STEPS, logging_steps=1,
            num_sample_generations=0, disable_tqdm=True, seed=3, learning_rate=1e-3, **save,
        )  # fmt: skip
        trainer = RLOOTrainer(
            config,
            tiny_tokenizer(padding_side="left"),
            tiny_model("llama"),
            tiny_model("llama"),
            KeywordReward("e"),
            toy_prompt_dataset(n=16),
        )
    elif name == "grpo":  # three passes over each generation batch: checkpoint-2 falls inside one
        from rlhfkit.rewards import KeywordReward
        from rlhfkit.tasks import toy_prompt_dataset
        from rlhfkit.testing import tiny_model, tiny_tokenizer
        from rlhfkit.trainers.grpo.config import GRPOConfig
        from rlhfkit.trainers.grpo.trainer import GRPOTrainer

        def count_e(completions, **columns):
            return KeywordReward("e")(completions)

        config = GRPOConfig(
            output_dir=str(out), report_to="none", use_cpu=True, per_device_train_batch_size=4,
            num_generations=2, num_iterations=3, max_completion_length=4, max_steps=STEPS, logging_steps=1,
            disable_tqdm=True, seed=3, learning_rate=1e-3, beta=0.05, **save,
        )  # fmt: skip
        trainer = GRPOTrainer(
            tiny_model("llama"),
            count_e,
            args=config,
            train_dataset=toy_prompt_dataset(n=16),
            processing_class=tiny_tokenizer(padding_side="left"),
        )
    else:
        from hf_fixtures import build

        trainer = build(name, str(out), per_device=2, max_steps=STEPS, **save)
    if kill:
        trainer.add_callback(KillDuringStep())
    return trainer


def _run_hf(name: str, out: Path, mode: str) -> dict[str, torch.Tensor]:
    trainer = _hf_trainer(name, out, kill=mode == "kill")
    trainer.train(resume_from_checkpoint=True if mode == "resume" else None)
    return dict(trainer.model.named_parameters())


def _run_ppo(out: Path, mode: str) -> dict[str, torch.Tensor]:
    from rlhfkit import PPOConfig, PPOTrainer
    from rlhfkit.testing import tiny_tokenizer, tiny_value_head_model

    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = tiny_value_head_model("llama", summary_dropout_prob=0.1)
    config = PPOConfig(batch_size=4, mini_batch_size=2, ppo_epochs=2, learning_rate=1e-3, seed=7,
                       init_kl_coef=0.5, use_score_scaling=True, use_score_norm=True)  # fmt: skip
    trainer = PPOTrainer(config, model, tokenizer=tok)
    if mode == "resume":
        trainer.load_checkpoint(str(out))  # the output folder: its latest intact checkpoint-<step>
    queries = [
        torch.tensor(tok.encode(t)) for t in ["the film was", "a story about", "we saw it", "the cast"]
    ]
    while trainer.current_step < STEPS:
        responses = trainer.generate(queries, return_prompt=False, max_new_tokens=5, do_sample=True)
        if mode == "kill" and trainer.current_step + 1 == KILL_IN:
            _die()
        scores = [torch.tensor(float(len(r)) + float(r.float().mean()) / 100) for r in responses]
        trainer.step(queries, responses, scores)
        if trainer.current_step % SAVE_EVERY == 0:
            trainer.save_checkpoint(str(out / f"checkpoint-{trainer.current_step}"))
    return dict(trainer.policy.named_parameters())


def _run_ddpo(out: Path, mode: str) -> dict[str, torch.Tensor]:
    from rlhfkit.models.sd_pipeline import DefaultDDPOStableDiffusionPipeline
    from rlhfkit.testing.diffusion import tiny_sd_pipeline_path
    from rlhfkit.trainers.ddpo.config import DDPOConfig
    from rlhfkit.trainers.ddpo.trainer import DDPOTrainer

    calls = itertools.count(1)

    def brightness(images, prompts, metadata):  # one call per epoch: the third is during epoch index 2
        if mode == "kill" and next(calls) == KILL_IN:
            _die()
        return images.mean(dim=(1, 2, 3))

    prompts = itertools.cycle(["a cat", "a dog"])  # two draws per epoch: a resumed cycle is in step
    config = DDPOConfig(
        num_epochs=STEPS, sample_num_steps=3, sample_batch_size=2, sample_num_batches_per_epoch=1,
        train_batch_size=2, mixed_precision="no", logdir=str(out), save_freq=SAVE_EVERY,
        train_learning_rate=1e-2, seed=0,
        resume_from=str(out / "checkpoints") if mode == "resume" else "",
    )  # fmt: skip
    torch.manual_seed(0)  # the LoRA weights are drawn when the pipeline is built
    pipe = DefaultDDPOStableDiffusionPipeline(str(tiny_sd_pipeline_path()))
    trainer = DDPOTrainer(config, brightness, lambda: (next(prompts), {}), pipe)
    trainer.train()
    return pipe.trainable_state_dict()


def run(name: str, out: Path, mode: str) -> None:
    runner = {"ppo": lambda: _run_ppo(out, mode), "ddpo": lambda: _run_ddpo(out, mode)}.get(
        name, lambda: _run_hf(name, out, mode)
    )
    weights = runner()
    save_file(
        {k: v.detach().contiguous().clone() for k, v in weights.items()}, str(out / "final.safetensors")
    )


if __name__ == "__main__":
    name, root, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    if mode == "full":
        run(name, root / "a", mode)
        run(name, root / "b", mode)
    else:
        run(name, root / "cut", mode)
