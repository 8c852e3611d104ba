"""PPOTrainer saves a policy sharded by FSDP2 (2 gloo processes): `save_pretrained` and `save_checkpoint`
write the whole weights, gathered across ranks, and a plain single-process model or trainer loads them
unchanged; a sharded run resumed from the checkpoint continues exactly as the uninterrupted one."""

import pytest
import torch
from launch import launch
from safetensors.torch import load_file
from workers.rl_fixtures import flat_params, ppo_trainer

from rlhfkit.models.value_head import AutoModelForCausalLMWithValueHead

pytestmark = pytest.mark.slow


def test_ppo_saves_and_resumes_under_fsdp2(tmp_path):
    r0, r1 = launch("ppo_save_worker.py", str(tmp_path))
    assert r0["sharded"] and r1["sharded"]
    assert r0["max_rank_diff"] == 0.0
    gathered = load_file(str(tmp_path / "gathered.safetensors"))["params"]
    # save_pretrained: the folder reloads into a plain model with exactly the gathered weights
    plain = AutoModelForCausalLMWithValueHead.from_pretrained(str(tmp_path / "pretrained"))
    assert torch.equal(flat_params(plain), gathered)
    # save_checkpoint: a single-process trainer resumes from it, weights and Adam's state included
    single = ppo_trainer(batch_size=2, adam=True)
    single.load_checkpoint(str(tmp_path / "checkpoint"))
    assert torch.equal(flat_params(single.model), gathered) and single.current_step == 1
    adam = single.optimizer.state_dict()["state"]
    assert len(adam) == len(list(single.model.parameters()))
    assert all(s["step"] == 1 and s["exp_avg"].abs().max() > 0 for s in adam.values())
    # the sharded run resumed from the checkpoint takes the same next step as the run that went on
    for r in (r0, r1):
        assert r["loaded_equals_saved"] and r["resumed_step"] == 2
        assert r["moved_after_save"] > 1e-3 and r["resumed_minus_continued"] == 0.0
