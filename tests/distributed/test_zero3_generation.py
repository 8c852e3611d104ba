"""`ds3_gather_for_generation`: under ZeRO-3 the policy's weights are gathered once around generation.

DeepSpeed needs GPUs, so a stand-in `deepspeed` module records what would be gathered."""

from __future__ import annotations

import contextlib
import sys
import types

import torch

from rlhfkit.trainers.common.sharding import sharded_generation_context


def _accelerator(zero_stage):
    plugin = None if zero_stage is None else types.SimpleNamespace(zero_stage=zero_stage)
    return types.SimpleNamespace(state=types.SimpleNamespace(deepspeed_plugin=plugin))


def test_gathers_only_under_zero3_when_asked(monkeypatch):
    gathered = []

    @contextlib.contextmanager
    def gathered_parameters(params):
        gathered.append(params)
        yield

    fake = types.ModuleType("deepspeed")
    fake.zero = types.SimpleNamespace(GatheredParameters=gathered_parameters)
    monkeypatch.setitem(sys.modules, "deepspeed", fake)
    model = torch.nn.Linear(2, 2)
    for stage, gather in ((None, True), (2, True), (3, False)):
        with sharded_generation_context(_accelerator(stage), model, gather):
            pass
    assert gathered == []
    with sharded_generation_context(_accelerator(3), model, True):
        pass
    assert len(gathered) == 1 and gathered[0] == list(model.parameters())


def test_configs_expose_the_switch():
    from rlhfkit import PPOConfig
    from rlhfkit.trainers.rloo.config import RLOOConfig

    assert PPOConfig().ds3_gather_for_generation is True
    assert RLOOConfig(output_dir="unused", report_to="none").ds3_gather_for_generation is True


def test_under_fsdp_the_fsdp_gather_is_used(monkeypatch):
    """An FSDP plugin routes to `fsdp_generation_context` (exercised on 2 processes in test_ppo_distributed),
    which leaves a model that is not an FSDP2 module as it is."""
    from rlhfkit.trainers.common import sharding

    calls = []
    real = sharding.fsdp_generation_context

    def recording(acc, model, gather):
        calls.append(gather)
        return real(acc, model, gather)

    monkeypatch.setattr(sharding, "fsdp_generation_context", recording)
    accelerator = types.SimpleNamespace(
        state=types.SimpleNamespace(fsdp_plugin=object(), deepspeed_plugin=None)
    )
    model = torch.nn.Linear(2, 2)
    before = [p.detach().clone() for p in model.parameters()]
    with sharded_generation_context(accelerator, model, False):
        model(torch.ones(1, 2))
    assert calls == [False]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
