"""Worker: GRPO's sampler correction on 2 gloo processes whose samplers disagree with training differently
(rank 0 reports every token half as likely as the model does: ratio 2; rank 1 twice as likely: ratio 0.5);
the logged ratio statistics cover both ranks."""

import dataclasses
import math
import tempfile

import torch
from launch import save_result

from workers.grpo_fixtures import grpo_trainer

trainer = grpo_trainer(
    tempfile.mkdtemp(), per_device=2, max_steps=1, vllm_importance_sampling_correction=True,
    vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_min=0.1,
)  # fmt: skip
ratio = 2.0 if trainer.accelerator.process_index == 0 else 0.5
sample = trainer._sample_groups


def shifted_sampler():
    groups = sample()
    batch = groups.batch
    logprobs = torch.where(batch.response_mask.bool(), batch.logprobs - math.log(ratio), batch.logprobs)
    return dataclasses.replace(groups, batch=batch.replace(logprobs=logprobs))


trainer._sample_groups = shifted_sampler
trainer.train()
logs = trainer.state.log_history[0]
save_result({k: v for k, v in logs.items() if k.startswith("sampling/importance_sampling_ratio/")})
