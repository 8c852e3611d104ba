"""GRPO and PPO on 2 processes in vLLM server mode, against one real `rlhfkit vllm-serve` (from
.venv-vllm): both ranks sample their own prompts on the server, rank 0 alone sends the weights after each
update, and the engine ends up serving the trained weights both ranks hold."""

from pathlib import Path

import pytest
from launch import launch

from rlhfkit.testing import tiny_model_path
from rlhfkit.testing.vllm_server import vllm_server

SERVER = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "rlhfkit"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SERVER.exists(), reason="no .venv-vllm: run `make vllm-env`"),
]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with vllm_server(SERVER, tiny_model_path("llama"), log) as base_url:
        yield base_url


@pytest.mark.parametrize("setting", ["ddp", "fsdp2"])
def test_two_processes_sample_on_one_server_and_the_main_one_syncs_it(url, setting):
    # each run starts by sending its initial weights, so the engine forgets the previous run's
    r0, r1 = launch("vllm_server_worker.py", url, *(["--fsdp"] if setting == "fsdp2" else []), timeout=600)
    assert (r0["rank"], r1["rank"], r0["world"]) == (0, 1, 2)
    assert r0["sharded"] == r1["sharded"] == (setting == "fsdp2")
    assert r0["steps"] == r1["steps"] == 2
    # every rank samples on the server, once for each of the 2 updates
    assert r0["generate_calls"] == r1["generate_calls"] == 2
    assert not set(map(tuple, r0["prompts"])) & set(map(tuple, r1["prompts"]))  # each its own prompts
    # rank 0 sends the weights before each of the 2 samplings and after the last update (one piece each)
    assert r0["weight_requests"] == 3 and r1["weight_requests"] == 0
    assert r0["weight_sum"] == r1["weight_sum"]  # the replicas trained alike
    # the engine serves the trained weights: each rank's model agrees with it, the initial one does not
    assert r0["gap_trained"] < 2e-4 and r1["gap_trained"] < 2e-4
    assert r0["gap_initial"] > 1e-2 and r1["gap_initial"] > 1e-2


def test_a_lora_policy_sharded_by_fsdp2_is_synced_merged(url):
    # each LoRA layer is gathered with its adapters and sent merged, one module at a time
    r0, r1 = launch("vllm_server_worker.py", url, "--fsdp", "--lora", timeout=600)
    assert r0["sharded"] and r1["sharded"] and r0["steps"] == r1["steps"] == 2
    assert r0["weight_requests"] == 3 and r1["weight_requests"] == 0
    # the last update came after the last sampling: until the sync the engine serves the weights before it
    assert r0["gap_before_sync"] > 1e-2 and r1["gap_before_sync"] > 1e-2
    assert r0["gap_trained"] < 2e-4 and r1["gap_trained"] < 2e-4  # after it, the merged trained policy
    assert r0["gap_initial"] > 1e-2 and r1["gap_initial"] > 1e-2


@pytest.mark.parametrize("setting", ["ddp", "fsdp2"])
def test_ppo_on_two_processes_generates_on_one_server_and_the_main_one_syncs_it(url, setting):
    r0, r1 = launch(
        "ppo_vllm_server_worker.py", url, *(["--fsdp"] if setting == "fsdp2" else []), timeout=600
    )
    assert (r0["rank"], r1["rank"], r0["world"]) == (0, 1, 2)
    assert r0["sharded"] == r1["sharded"] == (setting == "fsdp2")
    assert r0["policy_version"] == r1["policy_version"] == 2  # two optimizer steps each
    # every rank generates on the server, once per step, each its own prompts
    assert r0["generate_calls"] == r1["generate_calls"] == 2
    assert not set(map(tuple, r0["prompts"])) & set(map(tuple, r1["prompts"]))
    # rank 0 sends the weights at construction and before the second generation; rank 1 never
    assert r0["weight_requests"] == 2 and r1["weight_requests"] == 0
    assert r0["weight_sum"] == r1["weight_sum"]  # the replicas trained alike
    # after the last sync the engine serves the trained weights both ranks hold, not the initial ones
    assert r0["gap_trained"] < 2e-4 and r1["gap_trained"] < 2e-4
    assert r0["gap_initial"] > 1e-2 and r1["gap_initial"] > 1e-2
