"""CUDA, bf16 and fp16 checks of every rlhfkit trainer on the tiny offline models.

    PYTHONPATH=src python benchmarks/gpu/check_cuda.py [--only ppo_fp32,rloo_bf16] [--no-learning]

Why: CI has no GPU, so a tensor left on the CPU, a dtype mismatch under autocast, or bf16 weights that the
optimizer cannot move are only caught on a real device; fp16 adds loss scaling, whose overflow steps must
not be mistaken for NaN steps. Each check trains a few steps and asserts finite losses and statistics, no
skipped (non-finite) steps, parameters that changed, everything on cuda, and for the half-precision
variants that the linear layers really ran in that dtype. A failing check prints its error and the next
one runs. The learning checks repeat the CPU tests' "reward rises" setups on the GPU. A JSON summary goes
to $OUT/check_cuda.json (or --out).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

for _var, _value in (
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("HF_DATASETS_OFFLINE", "1"),
    ("TOKENIZERS_PARALLELISM", "false"),
    ("WANDB_MODE", "disabled"),
    ("TRANSFORMERS_VERBOSITY", "error"),
    ("DIFFUSERS_VERBOSITY", "error"),
):
    os.environ.setdefault(_var, _value)

import torch  # noqa: E402
from torch import nn  # noqa: E402

CHECKS: dict[str, tuple[Callable[[], dict], bool]] = {}  # name -> (function, is a learning check)


def check(name: str, learning: bool = False):
    def register(fn):
        CHECKS[name] = (fn, learning)
        return fn

    return register


# ------------------------------------------------------------------------------------------------ helpers
def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def assert_moved(model: nn.Module, before: dict[str, torch.Tensor], what: str) -> int:
    """Every trainable tensor must differ from its snapshot (lr 1e-3, so even bf16 weights move)."""
    params = dict(model.named_parameters())
    still = [n for n, v in before.items() if torch.equal(params[n].detach(), v)]
    if not before:
        raise AssertionError(f"{what}: no trainable parameters")
    if still:
        raise AssertionError(
            f"{what}: {len(still)}/{len(before)} trainable tensors did not change, e.g. {still[:3]}"
        )
    return len(before)


def assert_on_cuda(**modules: nn.Module | None) -> None:
    for what, module in modules.items():
        if module is None:
            continue
        off = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.device.type != "cuda"]
        if off:
            raise AssertionError(f"{what}: {len(off)} tensors not on cuda, e.g. {off[:3]}")


def assert_finite(values: dict[str, float], what: str) -> None:
    bad = {k: v for k, v in values.items() if not math.isfinite(float(v))}
    if bad:
        raise AssertionError(f"{what}: non-finite values {bad}")


def logged(trainer, key: str) -> list[float]:
    return [float(h[key]) for h in trainer.state.log_history if key in h]


class DtypeProbe:
    """Records the output dtypes of a model's linear layers while active: proof that autocast took effect."""

    def __init__(self, *models: nn.Module):
        self.models, self.dtypes, self.handles = models, set(), []

    def __enter__(self):
        for model in self.models:
            for module in model.modules():
                if isinstance(module, nn.Linear):
                    self.handles.append(module.register_forward_hook(self._hook))
        return self

    def _hook(self, module, inputs, output):
        if isinstance(output, torch.Tensor):
            self.dtypes.add(str(output.dtype).replace("torch.", ""))

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        return False


HALF = {"bf16": "bfloat16", "fp16": "float16"}


def require_half(probe: DtypeProbe, precision: str, what: str) -> None:
    if HALF[precision] not in probe.dtypes:
        raise AssertionError(
            f"{what}: {precision} requested but the linear layers ran in {sorted(probe.dtypes)}"
        )


def reset_between_checks() -> None:
    """Accelerate keeps one process-wide state; a check with another mixed precision needs it cleared."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def seed(value: int = 0) -> None:
    random.seed(value)
    torch.manual_seed(value)


def out_dir() -> str:
    return tempfile.mkdtemp(prefix="rlhfkit-cuda-check-")


def hf_common(precision: str, **kw) -> dict:
    """TrainingArguments shared by the Trainer-based checks (on the GPU: use_cpu stays off)."""
    base = dict(
        output_dir=out_dir(),
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        learning_rate=1e-3,
        seed=0,
        disable_tqdm=True,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
    )
    base.update(kw)
    return base


def hf_result(
    trainer,
    model: nn.Module,
    before: dict,
    probe: DtypeProbe,
    precision: str,
    what: str,
    extra_keys: tuple[str, ...] = (),
) -> dict:
    losses = logged(trainer, "loss")
    if not losses:
        raise AssertionError(f"{what}: no loss was logged")
    assert_finite(dict(enumerate(losses)), f"{what} losses")
    extras = {k: logged(trainer, k) for k in extra_keys}
    for key, values in extras.items():
        if not values:
            raise AssertionError(f"{what}: metric {key} was not logged")
        assert_finite(dict(enumerate(values)), f"{what} {key}")
    skipped = trainer.nonfinite_guard.skipped
    if skipped:
        raise AssertionError(
            f"{what}: {skipped} optimizer steps skipped as non-finite ({trainer.nonfinite_guard.last_cause})"
        )
    moved = assert_moved(model, before, what)
    if precision != "fp32":
        require_half(probe, precision, what)
        if trainer.accelerator.mixed_precision != precision:
            raise AssertionError(
                f"{what}: accelerator mixed_precision is {trainer.accelerator.mixed_precision!r}"
            )
    return {
        "losses": losses,
        "moved_tensors": moved,
        "linear_dtypes": sorted(probe.dtypes),
        **{k: v[-1] for k, v in extras.items()},
    }


# ------------------------------------------------------------------------------------------------ PPO
def _ppo(mode: str) -> dict:
    from rlhfkit import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
    from rlhfkit.tasks import toy_prompts
    from rlhfkit.testing import tiny_model_path, tiny_tokenizer

    seed()
    tok = tiny_tokenizer()
    kwargs = {"summary_dropout_prob": 0.0}
    if mode in ("bf16-weights", "lora-bf16"):
        kwargs["dtype"] = torch.bfloat16
    if mode == "lora-bf16":
        from peft import LoraConfig

        kwargs["peft_config"] = LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no value head found": expected for a plain LM
        model = AutoModelForCausalLMWithValueHead.from_pretrained(tiny_model_path("llama"), **kwargs)
    accelerator_kwargs = {"mixed_precision": mode[4:]} if mode.startswith("amp-") else {}
    config = PPOConfig(
        batch_size=8,
        mini_batch_size=4,
        ppo_epochs=2,
        learning_rate=1e-3,
        seed=0,
        accelerator_kwargs=accelerator_kwargs,
    )
    trainer = PPOTrainer(config, model, tokenizer=tok)
    queries = [torch.tensor(tok.encode(p)) for p in toy_prompts("train", n=8)]
    before = snapshot(trainer.policy)
    keys = (
        "ppo/loss/total",
        "ppo/loss/policy",
        "ppo/loss/value",
        "objective/kl",
        "ppo/policy/entropy",
        "ppo/mean_scores",
        "ppo/val/vpred",
        "ppo/policy/approxkl",
    )
    history = []
    with DtypeProbe(trainer.policy) as probe:
        for _ in range(3):
            responses = trainer.generate(
                queries, batch_size=8, return_prompt=False, max_new_tokens=8, do_sample=True, top_k=0
            )
            if any(r.device.type != "cuda" for r in responses):
                raise AssertionError(f"generate returned responses on {responses[0].device}")
            scores = [(r % 7 == 0).float().mean() for r in responses]  # any varied number will do
            stats = trainer.step(queries, responses, scores)
            step = {k: float(stats[k]) for k in keys}
            assert_finite(step, "PPO step stats")
            if stats.get("ppo/step_skipped") or float(stats.get("ppo/skipped_nonfinite_steps", 0)):
                raise AssertionError(f"PPO skipped a non-finite step: {trainer.nonfinite_guard.last_cause}")
            if float(stats.get("ppo/optimizer_steps", 1)) < 1:
                raise AssertionError("PPO step took no optimizer step")
            history.append(step)
    assert_moved(trainer.policy, before, "PPO policy")
    assert_on_cuda(policy=trainer.policy, reference=trainer.ref_model)
    if trainer.current_device.type != "cuda":
        raise AssertionError(f"PPO trainer runs on {trainer.current_device}")
    if mode.startswith("amp-"):
        require_half(probe, mode[4:], f"PPO {mode}")
    if mode in ("bf16-weights", "lora-bf16"):
        base = {
            p.dtype
            for p in trainer.policy.pretrained_model.parameters()
            if not p.requires_grad or mode != "lora-bf16"
        }
        head = {p.dtype for p in trainer.policy.v_head.parameters()}
        if base != {torch.bfloat16} or head != {torch.float32}:
            raise AssertionError(f"{mode}: base dtypes {base}, value head dtypes {head}")
        require_half(probe, "bf16", f"PPO {mode}")
    return {
        "loss_total": [h["ppo/loss/total"] for h in history],
        "kl": [h["objective/kl"] for h in history],
        "linear_dtypes": sorted(probe.dtypes),
    }


@check("ppo_fp32")
def ppo_fp32():
    return _ppo("fp32")


@check("ppo_bf16_autocast")
def ppo_bf16_autocast():
    """accelerator_kwargs={'mixed_precision': 'bf16'}: float32 weights, bf16 autocast."""
    return _ppo("amp-bf16")


@check("ppo_fp16_autocast")
def ppo_fp16_autocast():
    """accelerator_kwargs={'mixed_precision': 'fp16'}: loss scaling; an overflow step must not end the run."""
    return _ppo("amp-fp16")


@check("ppo_bf16_weights")
def ppo_bf16_weights():
    """Policy loaded with dtype=torch.bfloat16 (the value head stays float32 by design)."""
    return _ppo("bf16-weights")


@check("ppo_lora_bf16")
def ppo_lora_bf16():
    """bf16 base + LoRA policy: the reference is the same model with its adapter disabled."""
    return _ppo("lora-bf16")


def _ppo_reuse(mode: str) -> dict:
    """Old logprobs/values that generate() recorded vs step()'s forward pass, on the GPU.

    In fp32 both should agree to float rounding (pass: max |diff| of logprobs below 1e-3). bf16 weights or
    accelerate's bf16 autocast round the cached decoding path and a full forward differently, so there
    generate() must record nothing and step() must take the forward pass.
    """
    from rlhfkit import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
    from rlhfkit.tasks import toy_prompts
    from rlhfkit.testing import tiny_model_path, tiny_tokenizer

    seed()
    tok = tiny_tokenizer()
    kwargs = {"summary_dropout_prob": 0.0}
    if mode == "bf16-weights":
        kwargs["dtype"] = torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLMWithValueHead.from_pretrained(tiny_model_path("llama"), **kwargs)
    config = PPOConfig(
        batch_size=8,
        mini_batch_size=4,
        ppo_epochs=1,
        learning_rate=1e-3,
        seed=0,
        accelerator_kwargs={"mixed_precision": "bf16"} if mode == "amp-bf16" else {},
    )
    if not getattr(config, "reuse_generation_outputs", False):
        return {"skipped": "this PPOConfig has no reuse_generation_outputs"}
    trainer = PPOTrainer(config, model, tokenizer=tok)
    queries = [torch.tensor(tok.encode(p)).cuda() for p in toy_prompts("train", n=8)]
    responses = trainer.generate(
        queries, batch_size=8, return_prompt=False, max_new_tokens=12, do_sample=True, top_k=0
    )
    if mode != "fp32":
        if len(trainer.rollouts):
            raise AssertionError(f"{mode}: generate() recorded logprobs for a low-precision policy")
        stats = trainer.step(queries, responses, [torch.tensor(1.0)] * 8)
        if stats.get("ppo/reused_generation_outputs") != 0.0:
            raise AssertionError(f"{mode}: step() reused generation outputs in low precision")
        return {"reused_in_step": 0.0, "first_step_ratio_mean": float(stats["ppo/policy/ratio_mean"])}
    length = max(len(r) for r in responses)
    found = trainer.rollouts.lookup(queries, responses, length, trainer.policy_version)
    if found is None:
        raise AssertionError("generate() recorded no logprobs/values for the responses it returned")
    logprobs, _, values, mask = trainer.batched_forward_pass(trainer.policy, queries, responses)
    rec_logprobs, rec_values = (t.to(mask.device) for t in found)
    mask = mask.bool()
    lp_gap = float((rec_logprobs - logprobs).abs()[mask].max())
    v_gap = float((rec_values - values).abs()[mask].max())
    limit = 1e-3
    result = {
        "max_abs_logprob_gap": lp_gap,
        "max_abs_value_gap": v_gap,
        "limit": limit,
        "recorded_dtype": str(rec_logprobs.dtype),
        "tokens": int(mask.sum()),
    }
    if not (math.isfinite(lp_gap) and math.isfinite(v_gap)) or lp_gap > limit:
        raise AssertionError(
            f"{mode}: recorded vs forward logprobs differ by up to {lp_gap:.3g} (values {v_gap:.3g})"
        )
    stats = trainer.step(queries, responses, [torch.tensor(1.0)] * 8)
    result["reused_in_step"] = float(stats.get("ppo/reused_generation_outputs", float("nan")))
    result["first_step_ratio_mean"] = float(stats.get("ppo/policy/ratio_mean", float("nan")))
    return result


@check("ppo_reuse_fp32")
def ppo_reuse_fp32():
    return _ppo_reuse("fp32")


@check("ppo_reuse_bf16_autocast")
def ppo_reuse_bf16_autocast():
    return _ppo_reuse("amp-bf16")


@check("ppo_reuse_bf16_weights")
def ppo_reuse_bf16_weights():
    return _ppo_reuse("bf16-weights")


# ------------------------------------------------------------------------------------------------ RLOO
def _rloo(precision: str) -> dict:
    from rlhfkit.tasks import toy_prompt_dataset
    from rlhfkit.testing import tiny_model, tiny_tokenizer
    from rlhfkit.trainers.rloo.config import RLOOConfig
    from rlhfkit.trainers.rloo.trainer import RLOOTrainer

    seed()
    tok = tiny_tokenizer(padding_side="left")
    reward = tiny_model("llama-reward")
    config = RLOOConfig(
        **hf_common(precision, seed=3),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_mini_batches=2,
        rloo_k=2,
        num_ppo_epochs=2,
        response_length=6,
        total_episodes=32,
        num_sample_generations=0,
        stop_token="eos",
        missing_eos_penalty=1.0,
    )
    trainer = RLOOTrainer(
        config, tok, tiny_model("llama"), tiny_model("llama"), reward, toy_prompt_dataset(n=16)
    )
    before = snapshot(trainer.policy)
    with DtypeProbe(trainer.policy) as probe:
        trainer.train()
    keys = ("objective/scores", "objective/kl", "loss/policy_avg", "policy/entropy_avg", "val/ratio")
    for key in keys:
        values = logged(trainer, key)
        if not values:
            raise AssertionError(f"RLOO: {key} not logged")
        assert_finite(dict(enumerate(values)), f"RLOO {key}")
    if trainer.nonfinite_guard.skipped:
        raise AssertionError(f"RLOO skipped non-finite steps: {trainer.nonfinite_guard.last_cause}")
    moved = assert_moved(trainer.policy, before, "RLOO policy")
    assert_on_cuda(policy=trainer.policy, reference=trainer.ref_policy, reward=reward)
    if precision != "fp32":
        require_half(probe, precision, f"RLOO {precision}")
    return {
        "scores": logged(trainer, "objective/scores"),
        "loss": logged(trainer, "loss/policy_avg"),
        "moved_tensors": moved,
        "linear_dtypes": sorted(probe.dtypes),
    }


@check("rloo_fp32")
def rloo_fp32():
    return _rloo("fp32")


@check("rloo_bf16")
def rloo_bf16():
    return _rloo("bf16")


@check("rloo_fp16")
def rloo_fp16():
    return _rloo("fp16")


# ------------------------------------------------------------------------------------------------ reward
def _preference_pairs(n: int, chosen: str, rejected: str):
    import datasets

    rng = random.Random(0)
    words = ["the", "movie", "was", "plot", "actors", "music", "really", "quite", "story", "film"]
    rows = [
        {
            "prompt": " ".join(rng.choices(words, k=3)) + " ",
            "chosen": f"{chosen} {rng.choice(words)}",
            "rejected": f"{rejected} {rng.choice(words)}",
        }
        for _ in range(n)
    ]
    return datasets.Dataset.from_list(rows)


def _reward(precision: str) -> dict:
    from rlhfkit.testing import tiny_model, tiny_tokenizer
    from rlhfkit.trainers.reward_model.config import RewardConfig
    from rlhfkit.trainers.reward_model.trainer import RewardTrainer

    seed()
    model = tiny_model("llama-reward")
    args = RewardConfig(**hf_common(precision, max_steps=3, per_device_train_batch_size=4))
    trainer = RewardTrainer(
        model=model,
        args=args,
        train_dataset=_preference_pairs(16, "excellent", "terrible"),
        processing_class=tiny_tokenizer(padding_side="right"),
    )
    before = snapshot(trainer.model)
    with DtypeProbe(trainer.model) as probe:
        trainer.train()
    assert_on_cuda(model=trainer.model)
    return hf_result(trainer, trainer.model, before, probe, precision, "RewardTrainer", ("rewards/margins",))


@check("reward_fp32")
def reward_fp32():
    return _reward("fp32")


@check("reward_bf16")
def reward_bf16():
    return _reward("bf16")


# ------------------------------------------------------------------------------------------------ SFT
def _sft(precision: str, packing: bool = False) -> dict:
    """packing=True also takes the LoRA path, as tests/trainers/test_sft.py's packing test does."""
    import datasets

    from rlhfkit.testing import tiny_model, tiny_tokenizer
    from rlhfkit.trainers.sft.config import SFTConfig
    from rlhfkit.trainers.sft.trainer import SFTTrainer

    seed()
    docs = [
        "the cat sat on the mat",
        "a dog ran far away today",
        "hello there friend of mine",
        "rain falls on the quiet town",
        "we like to read long books at night",
        "birds sing in the morning",
    ]
    model = tiny_model("llama")
    extra = {}
    if packing:
        from peft import LoraConfig

        docs = docs * 4
        extra["peft_config"] = LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"])
    args = SFTConfig(
        **hf_common(precision, max_steps=3, per_device_train_batch_size=2),
        max_seq_length=16 if packing else 32,
        packing=packing,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_list([{"text": d} for d in docs]),
        processing_class=tiny_tokenizer(padding_side="right"),
        **extra,
    )
    before = snapshot(trainer.model)
    with DtypeProbe(trainer.model) as probe:
        trainer.train()
    assert_on_cuda(model=trainer.model)
    return hf_result(trainer, trainer.model, before, probe, precision, "SFTTrainer")


@check("sft_fp32")
def sft_fp32():
    return _sft("fp32")


@check("sft_bf16")
def sft_bf16():
    return _sft("bf16")


@check("sft_fp16")
def sft_fp16():
    return _sft("fp16")


@check("sft_bf16_packing_lora")
def sft_bf16_packing_lora():
    return _sft("bf16", packing=True)


# ------------------------------------------------------------------------------------------------ DPO
def _dpo(precision: str, precompute: bool = False) -> dict:
    from rlhfkit.testing import tiny_model, tiny_tokenizer
    from rlhfkit.trainers.dpo.config import DPOConfig
    from rlhfkit.trainers.dpo.trainer import DPOTrainer

    seed()
    model = tiny_model("llama")
    args = DPOConfig(
        **hf_common(precision, max_steps=3, per_device_train_batch_size=4),
        max_length=64,
        max_prompt_length=32,
        beta=0.1,
        precompute_ref_log_probs=precompute,
    )
    trainer = DPOTrainer(
        model=model,
        args=args,
        train_dataset=_preference_pairs(16, "yes good", "no bad"),
        processing_class=tiny_tokenizer(padding_side="right"),
    )
    before = snapshot(trainer.model)
    with DtypeProbe(trainer.model) as probe:
        trainer.train()
    assert_on_cuda(model=trainer.model, reference=trainer.ref_model)
    return hf_result(
        trainer,
        trainer.model,
        before,
        probe,
        precision,
        "DPOTrainer",
        ("rewards/margins", "rewards/accuracies", "logps/chosen"),
    )


@check("dpo_fp32")
def dpo_fp32():
    return _dpo("fp32")


@check("dpo_bf16")
def dpo_bf16():
    return _dpo("bf16")


@check("dpo_bf16_precompute")
def dpo_bf16_precompute():
    return _dpo("bf16", precompute=True)


# ------------------------------------------------------------------------------------------------ DDPO
def _ddpo(mixed_precision: str, learning: bool = False) -> dict:
    import itertools

    from rlhfkit.models.sd_pipeline import DefaultDDPOStableDiffusionPipeline
    from rlhfkit.testing.diffusion import tiny_sd_pipeline_path
    from rlhfkit.trainers.ddpo.config import DDPOConfig
    from rlhfkit.trainers.ddpo.trainer import DDPOTrainer

    seed()
    prompts = itertools.cycle(["a cat", "a dog"])

    def prompt_fn():
        return next(prompts), {}

    def brightness(images, prompts, metadata):
        return images.mean(dim=(1, 2, 3)), {}

    if learning:  # the CPU test's setting: one on-policy optimizer step per epoch, 8 epochs
        values = dict(
            num_epochs=8,
            sample_num_steps=10,
            sample_batch_size=8,
            sample_num_batches_per_epoch=1,
            train_batch_size=8,
            train_learning_rate=2e-2,
            sample_guidance_scale=1.0,
            train_cfg=False,
        )
    else:
        values = dict(
            num_epochs=2,
            sample_num_steps=3,
            sample_batch_size=2,
            sample_num_batches_per_epoch=2,
            train_batch_size=2,
            train_learning_rate=1e-2,
        )
    config = DDPOConfig(**values, mixed_precision=mixed_precision, logdir=out_dir(), save_freq=1000)
    pipe = DefaultDDPOStableDiffusionPipeline(str(tiny_sd_pipeline_path()), use_lora=True)
    trainer = DDPOTrainer(config, brightness, prompt_fn, pipe)
    before = {i: p.detach().clone() for i, p in enumerate(trainer.trainable_params)}
    trainer.train()
    losses = [float(h["loss"]) for h in trainer.log_history if "loss" in h]
    rewards = [float(h["reward_mean"]) for h in trainer.log_history if "reward_mean" in h]
    if not losses:
        raise AssertionError("DDPO logged no loss")
    assert_finite(dict(enumerate(losses + rewards)), "DDPO losses/rewards")
    if trainer.nonfinite_guard.skipped:
        raise AssertionError(f"DDPO skipped non-finite steps: {trainer.nonfinite_guard.last_cause}")
    still = [i for i, p in enumerate(trainer.trainable_params) if torch.equal(p.detach(), before[i])]
    if still:
        raise AssertionError(f"DDPO: {len(still)}/{len(before)} trainable LoRA tensors did not change")
    assert_on_cuda(unet=pipe.unet, vae=pipe.vae, text_encoder=pipe.text_encoder)
    want = {"no": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[mixed_precision]
    if pipe.vae.dtype != want or pipe.text_encoder.dtype != want:
        raise AssertionError(
            f"DDPO {mixed_precision}: vae {pipe.vae.dtype}, text encoder {pipe.text_encoder.dtype}"
        )
    result = {
        "losses": losses,
        "reward_mean": rewards,
        "accelerator_mixed_precision": trainer.accelerator.mixed_precision,
    }
    if learning:
        spread = [float(h["reward_std"]) for h in trainer.log_history if "reward_std" in h][0]
        gain = sum(rewards[-2:]) / 2 - rewards[0]
        result.update(gain=gain, initial_spread=spread)
        if not gain > max(0.008, 2 * spread):
            raise AssertionError(
                f"DDPO brightness did not rise enough: gain {gain:.4f}, spread {spread:.4f}, {rewards}"
            )
    return result


@check("ddpo_fp32")
def ddpo_fp32():
    return _ddpo("no")


@check("ddpo_bf16")
def ddpo_bf16():
    return _ddpo("bf16")


@check("ddpo_fp16_default")
def ddpo_fp16_default():
    """fp16 is DDPOConfig's default, so it is what a GPU user gets without asking."""
    return _ddpo("fp16")


# ------------------------------------------------------------------------------------------------ learning
def _ppo_learning(bf16: bool) -> dict:
    """tests/trainers/test_ppo_learning.py's task: reward = share of response tokens among the initial
    model's 20 favourite next tokens; PPO must concentrate the policy on them."""
    from rlhfkit import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
    from rlhfkit.rollout import pad_left, pad_right
    from rlhfkit.tasks import toy_prompts
    from rlhfkit.testing import tiny_model_path, tiny_tokenizer

    seed()
    tok = tiny_tokenizer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLMWithValueHead.from_pretrained(
            tiny_model_path("llama"), summary_dropout_prob=0.0
        )
    config = PPOConfig(
        batch_size=32,
        mini_batch_size=16,
        ppo_epochs=4,
        learning_rate=1e-3,
        init_kl_coef=0.05,
        seed=0,
        accelerator_kwargs={"mixed_precision": "bf16"} if bf16 else {},
    )
    trainer = PPOTrainer(config, model, tokenizer=tok)
    queries = [torch.tensor(tok.encode(p)) for p in toy_prompts("train", n=64)]
    ids, mask = pad_left(queries, tok.pad_token_id)
    with torch.no_grad():
        probs = (
            trainer.policy(input_ids=ids.cuda(), attention_mask=mask.cuda())[0][:, -1]
            .float()
            .softmax(-1)
            .mean(0)
        )
    favourites = probs.topk(20).indices
    scores_per_step = []
    for step in range(25):
        batch = [queries[(step * 32 + i) % len(queries)] for i in range(32)]
        responses = trainer.generate(
            batch, return_prompt=False, max_new_tokens=2, do_sample=True, top_k=0, batch_size=32
        )
        response_ids, response_mask = pad_right(responses, tok.pad_token_id)
        hits = (torch.isin(response_ids, favourites) & response_mask).sum(1).float()
        stats = trainer.step(batch, responses, list(hits / response_mask.sum(1)))
        scores_per_step.append(float(stats["ppo/mean_scores"]))
    start, end = sum(scores_per_step[:5]) / 5, sum(scores_per_step[-3:]) / 3
    if not (end > 0.3 and end > start + 0.2):
        raise AssertionError(
            f"PPO score did not rise: first 5 {start:.3f}, last 3 {end:.3f}: {scores_per_step}"
        )
    return {"first5": start, "last3": end, "scores": scores_per_step}


@check("ppo_learning_fp32", learning=True)
def ppo_learning_fp32():
    return _ppo_learning(False)


@check("ppo_learning_bf16", learning=True)
def ppo_learning_bf16():
    return _ppo_learning(True)


def _rloo_learning(bf16: bool) -> dict:
    """tests/trainers/test_rloo.py's task: count of the letter "e" in the completion (capped at 5)."""
    from rlhfkit.rewards import KeywordReward
    from rlhfkit.tasks import toy_prompt_dataset
    from rlhfkit.testing import tiny_model, tiny_tokenizer
    from rlhfkit.trainers.rloo.config import RLOOConfig
    from rlhfkit.trainers.rloo.trainer import RLOOTrainer

    seed()
    tok = tiny_tokenizer(padding_side="left")
    config = RLOOConfig(
        **hf_common("bf16" if bf16 else "fp32", learning_rate=3e-3, lr_scheduler_type="constant"),
        per_device_train_batch_size=16,
        gradient_accumulation_steps=1,
        rloo_k=4,
        num_ppo_epochs=1,
        response_length=6,
        total_episodes=16 * 30,
        num_sample_generations=0,
        temperature=1.0,
        kl_coef=0.0,
    )
    trainer = RLOOTrainer(
        config, tok, tiny_model("llama"), tiny_model("llama"), KeywordReward("e"), toy_prompt_dataset(n=200)
    )
    trainer.train()
    scores = logged(trainer, "objective/scores")
    before, after = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    if len(scores) != 30 or not after > before + 1.5:
        raise AssertionError(f"RLOO score did not rise: first 5 {before:.2f}, last 5 {after:.2f}: {scores}")
    return {"first5": before, "last5": after, "scores": scores}


@check("rloo_learning_fp32", learning=True)
def rloo_learning_fp32():
    return _rloo_learning(False)


@check("rloo_learning_bf16", learning=True)
def rloo_learning_bf16():
    return _rloo_learning(True)


@check("ddpo_learning_fp32", learning=True)
def ddpo_learning_fp32():
    return _ddpo("no", learning=True)


# ------------------------------------------------------------------------------------------------ main
def environment() -> dict:
    import importlib.metadata as md

    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    for name in (
        "transformers",
        "accelerate",
        "datasets",
        "peft",
        "diffusers",
        "tokenizers",
        "huggingface_hub",
    ):
        try:
            info[name] = md.version(name)
        except md.PackageNotFoundError:
            info[name] = "missing"
    try:
        import rlhfkit

        info["rlhfkit_from"] = str(Path(rlhfkit.__file__).parent)
    except Exception as exc:  # reported, and every check will then fail with the same error
        info["rlhfkit_from"] = f"import failed: {exc}"
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name()
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma list of check names (default: all)")
    parser.add_argument("--no-learning", action="store_true", help="skip the slower reward-rises checks")
    parser.add_argument("--out", default=os.environ.get("OUT") or ".", help="folder for check_cuda.json")
    parser.add_argument("--list", action="store_true", help="print the check names and exit")
    parser.add_argument("--json-name", default="check_cuda.json", help="name of the summary file in --out")
    args = parser.parse_args()
    if args.list:
        print("\n".join(f"{n}{' (learning)' if learning else ''}" for n, (_, learning) in CHECKS.items()))
        return 0
    names = [n for n in args.only.split(",") if n] or [
        n for n, (_, lr) in CHECKS.items() if not (lr and args.no_learning)
    ]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        parser.error(f"unknown checks {unknown}; see --list")
    env = environment()
    print("environment: " + json.dumps(env), flush=True)
    results = []
    if not torch.cuda.is_available():
        print("SKIP all: torch sees no CUDA device", flush=True)
    else:
        os.environ.setdefault("RLHFKIT_CACHE", os.path.join(tempfile.gettempdir(), "rlhfkit-cache"))
        for name in names:
            fn, _ = CHECKS[name]
            reset_between_checks()
            start = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    detail = fn()
                status, error = "PASS", None
            except Exception as exc:  # one broken trainer must not hide the others
                status, error, detail = (
                    "FAIL",
                    f"{type(exc).__name__}: {exc}",
                    {"traceback": traceback.format_exc()},
                )
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            peak = torch.cuda.max_memory_allocated() / 2**20
            results.append(
                {
                    "check": name,
                    "status": status,
                    "error": error,
                    "seconds": round(seconds, 2),
                    "gpu_peak_mb": round(peak, 1),
                    "detail": detail,
                }
            )
            short = "" if error is None else " :: " + error.splitlines()[0][:400]
            print(f"{status} {name} ({seconds:.1f} s, peak {peak:.0f} MiB){short}", flush=True)
            if error is not None:
                print(detail["traceback"], flush=True)
    passed = sum(r["status"] == "PASS" for r in results)
    print(f"{passed}/{len(results)} checks passed", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / args.json_name).write_text(
        json.dumps(
            {"environment": env, "passed": passed, "total": len(results), "results": results},
            indent=2,
            default=str,
        )
        + "\n"
    )
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
