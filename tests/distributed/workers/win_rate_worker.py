"""Worker: GRPOTrainer with a WinRateCallback on 2 gloo processes.

Only rank 0 samples, judges, logs and writes samples.jsonl; rank 1 trains on and waits for it at the next
collective; the replicas stay identical.
"""

import json
import tempfile
from pathlib import Path

import torch
from launch import save_result

from rlhfkit.judges import RuleJudge
from rlhfkit.rewards import KeywordReward
from rlhfkit.trainers.common.win_rate import WinRateCallback
from workers.grpo_fixtures import flat_params, grpo_trainer

out = tempfile.mkdtemp()
trainer = grpo_trainer(out, per_device=2, learning_rate=1e-2)
prompts = [f"Tell me about topic {i}:" for i in range(4)]
trainer.add_callback(
    WinRateCallback(
        RuleJudge.of_texts(KeywordReward("e")), prompts, trainer=trainer, every_n_steps=1, max_new_tokens=4
    )
)
trainer.train()
everyone = trainer.accelerator.gather(flat_params(trainer.model)[None])
samples = Path(out) / "samples.jsonl"
rows = [json.loads(line) for line in samples.open()] if samples.exists() else []
save_result(
    {
        "rank": trainer.accelerator.process_index,
        "win_rates": [
            [h["step"], h["eval/win_rate"]] for h in trainer.state.log_history if "eval/win_rate" in h
        ],
        "pair_steps": [r["step"] for r in rows if r["table"] == "win_rate"],
        "max_rank_diff": (everyone - everyone[0]).abs().max().item(),
        "finite": bool(torch.isfinite(everyone).all()),
    }
)
