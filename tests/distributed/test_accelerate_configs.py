"""The shipped accelerate configs load with accelerate's own reader, use only options accelerate knows, and
the CPU/gloo one really starts two processes through `accelerate launch`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from launch import WORKERS, free_port, worker_env

CONFIGS = Path(__file__).parents[2] / "examples" / "accelerate_configs"
EXPECTED = {
    "multi_gpu.yaml": ("MULTI_GPU", {}),
    "multi_cpu_gloo.yaml": ("MULTI_GPU", {}),
    "fsdp.yaml": ("FSDP", {"fsdp_version": 2}),
    "deepspeed_zero2.yaml": ("DEEPSPEED", {"zero_stage": 2}),
    "deepspeed_zero3.yaml": ("DEEPSPEED", {"zero_stage": 3}),
}


def test_every_config_is_shipped_and_documented():
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)
    doc = (Path(__file__).parents[2] / "docs" / "distributed.md").read_text()
    assert all(name in doc for name in EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_loads_with_known_options(name):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    config = load_config_from_file(str(CONFIGS / name))
    kind, plugin = EXPECTED[name]
    assert config.distributed_type.value == kind
    settings = {**(config.fsdp_config or {}), **(config.deepspeed_config or {})}
    assert plugin.items() <= settings.items()
    flags = {a.dest for a in launch_command_parser()._actions}
    unknown = sorted(k for k in settings if k not in flags)
    assert not unknown, f"{name}: accelerate launch has no option for {unknown}"


@pytest.mark.slow
def test_accelerate_launch_with_the_cpu_config_starts_two_processes(tmp_path):
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(CONFIGS / "multi_cpu_gloo.yaml"), "--main_process_port", str(free_port()),
        str(WORKERS / "plain_step.py"),
    ]  # fmt: skip
    env = worker_env({"RLHFKIT_DIST_OUT": str(tmp_path)})
    env.pop("ACCELERATE_USE_CPU")  # the config file alone must force the CPU
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    import json

    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in results] == [2, 2]
    assert results[0]["params"] == results[1]["params"]
