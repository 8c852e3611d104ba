"""Reward / SFT / DPO / KTO trainers with fixed data, built identically by the workers and the one-process
references."""

from __future__ import annotations

import datasets
import torch

from rlhfkit.testing import tiny_model, tiny_tokenizer

WORDS = ["the", "movie", "was", "plot", "actors", "music", "story", "film"]
STEPS = 2


def _args(config_cls, out: str, per_device: int, **kw):
    base = dict(
        output_dir=out, use_cpu=True, report_to="none", max_steps=STEPS,
        per_device_train_batch_size=per_device, save_strategy="no", logging_steps=1, learning_rate=0.05,
        optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0, seed=0, disable_tqdm=True,
    )  # fmt: skip
    base.update(kw)
    return config_cls(**base)


def _pairs(n: int):
    # every row tokenises to the same length, so per-rank means average to the global mean exactly
    rows = []
    for i in range(n):
        a, b, c = WORDS[i % 8], WORDS[(3 * i + 1) % 8], WORDS[(5 * i + 2) % 8]
        rows.append({"prompt": f"{a} {b} {c}: ", "chosen": "yes good", "rejected": "no bad"})
    return datasets.Dataset.from_list(rows)


def build(name: str, out: str, per_device: int, **kw):
    torch.manual_seed(0)
    tok = tiny_tokenizer(padding_side="right")
    if name == "reward":
        from rlhfkit.trainers.reward_model.config import RewardConfig
        from rlhfkit.trainers.reward_model.trainer import RewardTrainer

        model = tiny_model("llama-reward")
        args = _args(RewardConfig, out, per_device, **kw)
        return RewardTrainer(model=model, args=args, train_dataset=_pairs(16), processing_class=tok)
    if name == "sft":
        from rlhfkit.trainers.sft.config import SFTConfig
        from rlhfkit.trainers.sft.trainer import SFTTrainer

        texts = [{"text": f"{WORDS[i % 8]} {WORDS[(i + 3) % 8]} {WORDS[(i + 5) % 8]}"} for i in range(16)]
        args = _args(SFTConfig, out, per_device, max_seq_length=32, **kw)
        return SFTTrainer(
            model=tiny_model("llama"),
            args=args,
            train_dataset=datasets.Dataset.from_list(texts),
            processing_class=tok,
        )
    if name == "dpo":
        from rlhfkit.trainers.dpo.config import DPOConfig
        from rlhfkit.trainers.dpo.trainer import DPOTrainer

        args = _args(DPOConfig, out, per_device, max_length=64, max_prompt_length=32, **kw)
        return DPOTrainer(
            model=tiny_model("llama"), args=args, train_dataset=_pairs(16), processing_class=tok
        )
    if name == "kto":
        from rlhfkit.trainers.kto.config import KTOConfig
        from rlhfkit.trainers.kto.trainer import KTOTrainer

        args = _args(KTOConfig, out, per_device, max_length=64, **kw)
        return KTOTrainer(model=tiny_model("llama"), args=args, train_dataset=_pairs(8), processing_class=tok)
    raise ValueError(name)


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def numeric_logs(trainer) -> list[dict[str, float]]:
    skip = {"epoch", "step", "grad_norm", "learning_rate"}
    return [
        {k: float(v) for k, v in h.items() if isinstance(v, (int, float)) and k not in skip
         and "runtime" not in k and "per_second" not in k and "flos" not in k}
        for h in trainer.state.log_history
    ]  # fmt: skip
