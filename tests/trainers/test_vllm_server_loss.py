"""A vLLM server that dies mid-run, for real: GRPO trains on `rlhfkit vllm-serve` (from .venv-vllm) with a
checkpoint after every update, the server is killed after the second one is saved, and the run stops at
once with `VLLMServerLost` (the URL, how to go on), its checkpoints whole; a restarted server and
`resume_from_checkpoint` finish the run from checkpoint-2, and the engine follows the resumed policy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from rlhfkit import GRPOConfig, GRPOTrainer
from rlhfkit.rewards import KeywordReward
from rlhfkit.rollout import SamplingParams
from rlhfkit.rollout.vllm_client import VLLMServerLost
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_model_path, tiny_tokenizer
from rlhfkit.testing.vllm_server import kill_server, vllm_server, vllm_server_process
from rlhfkit.trainers.common.atomic_folders import LOCK_FILE

SERVER = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "rlhfkit"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SERVER.exists(), reason="no .venv-vllm: run `make vllm-env`"),
]


def count_e(completions, **kwargs):
    return KeywordReward("e")(completions)


class KillServerAfterSave(TrainerCallback):
    """Kills `server` (SIGKILL, as a crash) once checkpoint-`step` is saved."""

    def __init__(self, server, step: int):
        self.server, self.step = server, step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            kill_server(self.server)


def _trainer(out: Path, url: str, callbacks=()) -> GRPOTrainer:
    config = GRPOConfig(
        output_dir=str(out), report_to="none", use_cpu=True, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=5, max_steps=4, logging_steps=1, save_strategy="steps", save_steps=1,
        disable_tqdm=True, seed=3, learning_rate=1e-2,
        use_vllm=True, vllm_mode="server", vllm_server_base_url=url, vllm_server_timeout=30,
    )  # fmt: skip
    return GRPOTrainer(
        tiny_model("llama"), count_e, args=config, train_dataset=toy_prompt_dataset(n=16),
        processing_class=tiny_tokenizer(padding_side="left"), callbacks=list(callbacks),
    )  # fmt: skip


def test_a_server_that_dies_mid_run_stops_it_and_the_last_checkpoint_resumes(tmp_path):
    out = tmp_path / "out"
    with vllm_server_process(SERVER, tiny_model_path("llama"), tmp_path / "first.log") as (url, server):
        trainer = _trainer(out, url, [KillServerAfterSave(server, step=2)])
        with pytest.raises(VLLMServerLost) as lost:
            trainer.train()
    message = str(lost.value)
    assert url in message and "resume_from_checkpoint" in message and "vllm-serve" in message
    assert trainer.state.global_step == 2  # stopped before a third update
    # checkpoints 1 and 2 whole; nothing of a third, no staging folder left behind
    assert sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE) == ["checkpoint-1", "checkpoint-2"]
    trained = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    with vllm_server(SERVER, tiny_model_path("llama"), tmp_path / "second.log") as url:
        resumed = _trainer(out, url)
        resumed.train(resume_from_checkpoint=True)
        assert resumed.state.global_step == 4
        steps = [h["step"] for h in resumed.state.log_history if "loss" in h]
        assert steps == [1, 2, 3, 4]  # two logged before the loss, two after the resume
        engine = resumed._sampler()  # synced with the final policy: logprobs agree with the trainer's
        ids = torch.tensor([[5, 6, 7, 8]])
        torch.manual_seed(0)
        params = SamplingParams(max_new_tokens=4, temperature=1.0, top_k=0)
        sampled = engine.generate(ids, torch.ones_like(ids), params, logprob_temperature=1.0)
        completion = sampled.responses[0][sampled.response_mask[0]]
        with torch.no_grad():
            logits = resumed.model(torch.cat([ids[0], completion])[None]).logits[0, 3:-1]
        ours = logits.log_softmax(-1).gather(-1, completion[:, None])[:, 0]
        torch.testing.assert_close(sampled.logprobs[0][: len(completion)], ours, rtol=0, atol=2e-4)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == [
        f"checkpoint-{i}" for i in (1, 2, 3, 4)
    ]
    # the resumed run started from checkpoint-2's weights: they are the dead run's last ones
    saved = load_file(str(out / "checkpoint-2" / "model.safetensors"))
    for name, tensor in saved.items():
        torch.testing.assert_close(tensor, trained[name], rtol=0, atol=0)
