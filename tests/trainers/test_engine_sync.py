"""Who sends an inference engine its weights under several training processes (`engine_sync`)."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from rlhfkit.trainers.common.engine_sync import engine_options, sync_engine


def _accelerator(processes: int, main: bool, events: list | None = None):
    return SimpleNamespace(
        num_processes=processes,
        is_main_process=main,
        wait_for_everyone=lambda: events.append("barrier") if events is not None else None,
    )


def test_only_the_main_process_sends_weights_to_a_server():
    options = {"base_url": "http://h:1", "timeout": 5.0}
    assert engine_options("vllm-server", options, _accelerator(2, True))["sends_weights"] is True
    expected = {**options, "sends_weights": False, "gather_module": None}
    assert engine_options("vllm-server", options, _accelerator(2, False)) == expected
    assert engine_options("vllm-server", options, _accelerator(1, True))["sends_weights"] is True


def test_a_colocated_engine_under_several_processes_is_refused_naming_server_mode():
    assert engine_options("vllm-colocate", {"a": 1}, _accelerator(1, True)) == {"a": 1}
    with pytest.raises(ValueError, match=r"use_vllm \(vllm-colocate\) runs with one training process.*"
                       r"with 2, use vllm_mode='server'"):  # fmt: skip
        engine_options("vllm-colocate", {}, _accelerator(2, True))


def test_every_process_waits_for_the_weights_before_sampling():
    events = []
    engine = SimpleNamespace(sync_weights=lambda model: events.append(("sync", model)))
    sync_engine(engine, "policy", _accelerator(2, False, events))
    assert events == [("sync", "policy"), "barrier"]


def test_under_zero3_the_server_sync_gathers_one_module_at_a_time(monkeypatch):
    fake = types.ModuleType("deepspeed")  # DeepSpeed does not run on CPU: a stand-in module
    fake.zero = SimpleNamespace(GatheredParameters=object())
    monkeypatch.setitem(sys.modules, "deepspeed", fake)
    accelerator = _accelerator(2, True)
    accelerator.state = SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=3))
    options = engine_options("vllm-server", {}, accelerator)
    assert options["gather_module"] is fake.zero.GatheredParameters
    accelerator.state.deepspeed_plugin.zero_stage = 2  # whole weights on every process: nothing to gather
    assert engine_options("vllm-server", {}, accelerator)["gather_module"] is None


def test_under_fsdp_the_server_sync_reads_one_tensor_at_a_time():
    accelerator = _accelerator(2, False)
    accelerator.state = SimpleNamespace(fsdp_plugin=object())
    gather = engine_options("vllm-server", {}, accelerator)["gather_module"]
    with gather([]) as gathered:  # DTensors are gathered as they are read: the block itself does nothing
        assert gathered is None
