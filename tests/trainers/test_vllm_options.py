"""The `use_vllm` / `vllm_*` config fields (TRL 1.x's names and defaults) without an engine: the backend
each setting selects, the refusals naming the field, the defaults left as they were, and an unreachable
server stopping a run before its first update with the URL named."""

from __future__ import annotations

import pytest
import torch

from rlhfkit import GRPOConfig, GRPOTrainer, PPOConfig, PPOTrainer, RLOOConfig
from rlhfkit.rollout import backends, forward_response, pad_left
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_tokenizer, tiny_value_head_model
from rlhfkit.testing.vllm_server import free_port


def _grpo(tmp_path, **kwargs) -> GRPOConfig:
    return GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, **kwargs)


def test_trl_defaults_and_the_default_backend_stay(tmp_path):
    for config in (_grpo(tmp_path), RLOOConfig(output_dir=str(tmp_path), report_to="none"), PPOConfig()):
        assert config.use_vllm is False and config.vllm_mode == "colocate"
        assert (config.vllm_server_host, config.vllm_server_port) == ("0.0.0.0", 8000)
        assert config.vllm_server_timeout == 240.0 and config.vllm_group_port == 51216
        assert config.vllm_gpu_memory_utilization == 0.3 and config.vllm_tensor_parallel_size == 1
        assert config.vllm_model_impl == "vllm" and config.vllm_structured_outputs_regex is None
        assert config.generation_engine() == ("rlhfkit", {})
    assert _grpo(tmp_path, generation_backend="transformers").generation_engine() == ("transformers", {})
    assert not _grpo(tmp_path).sampler_correction_active()


def test_server_mode_builds_the_url_from_host_and_port_unless_a_base_url_is_given(tmp_path):
    config = _grpo(
        tmp_path, use_vllm=True, vllm_mode="server", vllm_server_host="10.0.0.7", vllm_server_port=9001,
        vllm_server_timeout=12.5,
    )  # fmt: skip
    assert config.generation_engine() == (
        "vllm-server",
        {"base_url": "http://10.0.0.7:9001", "timeout": 12.5},
    )
    config.vllm_server_base_url = "http://engine:8000"
    assert config.generation_engine()[1]["base_url"] == "http://engine:8000"
    assert config.sampler_correction_active()  # TRL's default: the correction is on with an engine
    off = _grpo(tmp_path, use_vllm=True, vllm_mode="server", vllm_importance_sampling_correction=False)
    assert not off.sampler_correction_active()


def test_colocate_mode_passes_its_fields_to_the_colocated_engine(tmp_path):
    config = PPOConfig(
        use_vllm=True, vllm_gpu_memory_utilization=0.5, vllm_max_model_length=256,
        vllm_enable_sleep_mode=True, vllm_model_impl="transformers",
    )  # fmt: skip
    assert config.generation_engine() == (
        "vllm-colocate",
        {"gpu_memory_utilization": 0.5, "tensor_parallel_size": 1, "max_model_length": 256,
         "enable_sleep_mode": True, "model_impl": "transformers"},
    )  # fmt: skip
    assert (
        backends.GENERATION_BACKENDS["vllm-colocate"] == "rlhfkit.rollout.vllm_colocate:VLLMColocateBackend"
    )


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("vllm_mode", "remote", r"vllm_mode must be one of server, colocate; got 'remote'"),
        ("vllm_model_impl", "jax", r"vllm_model_impl must be one of vllm, transformers; got 'jax'"),
        ("vllm_server_port", 0, r"vllm_server_port must be a positive integer, got 0"),
        ("vllm_server_timeout", 0.0, r"vllm_server_timeout must be > 0, got 0.0"),
        ("vllm_tensor_parallel_size", 0, r"vllm_tensor_parallel_size must be a positive integer, got 0"),
        ("vllm_max_model_length", -5, r"vllm_max_model_length must be a positive integer, got -5"),
        ("vllm_gpu_memory_utilization", 1.5, r"vllm_gpu_memory_utilization must be in \(0, 1\], got 1.5"),
        ("vllm_structured_outputs_regex", "(yes", r"vllm_structured_outputs_regex='\(yes' is not a regular"),
        (
            "vllm_structured_outputs_regex",
            r"\d+",
            r"vllm_structured_outputs_regex constrains .* use_vllm=True",
        ),
        (
            "vllm_group_port",
            51217,
            r"vllm_group_port=51217 has no effect .* NCCL weight-transfer group.* over HTTP .* in memory "
            r".* on CPU too, where there is no NCCL group; leave it at 51216",
        ),
    ],
)
def test_bad_or_unoffered_settings_name_the_field(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        _grpo(tmp_path, **{field: value})
    with pytest.raises(ValueError, match=message):
        RLOOConfig(output_dir=str(tmp_path), report_to="none", **{field: value})
    with pytest.raises(ValueError, match=message):
        PPOConfig(**{field: value})


def test_a_structured_outputs_regex_reaches_either_engine(tmp_path):
    from rlhfkit.trainers.common.engine_sync import engine_options

    server = _grpo(tmp_path, use_vllm=True, vllm_mode="server", vllm_structured_outputs_regex=r"\d+")
    assert server.generation_engine()[1]["structured_outputs_regex"] == r"\d+"
    config = PPOConfig(use_vllm=True, vllm_structured_outputs_regex=r"(yes|no)")
    engine, options = config.generation_engine()
    assert options["structured_outputs_regex"] == "(yes|no)"

    class OneProcess:
        num_processes = 1

    tokenizer = tiny_tokenizer()  # the colocated engine matches text: it needs the tokenizer, a server not
    assert engine_options(engine, options, OneProcess(), tokenizer)["tokenizer"] is tokenizer
    assert "tokenizer" not in engine_options(
        engine, PPOConfig(use_vllm=True).generation_engine()[1], OneProcess()
    )


def test_the_colocated_engine_refuses_a_regex_without_a_tokenizer():
    from rlhfkit.rollout.vllm_colocate import VLLMColocateBackend

    with pytest.raises(ValueError, match=r"structured_outputs_regex needs the tokenizer \(tokenizer=...\)"):
        VLLMColocateBackend(tiny_model("llama"), 1, structured_outputs_regex="(yes|no)")


def test_make_generation_backend_passes_the_options_to_the_backend(monkeypatch):
    seen = {}

    class Recorder(backends.GenerationBackend):
        def __init__(self, model, pad_token_id, *, base_url, timeout, **common):
            seen.update(base_url=base_url, timeout=timeout, **common)

    monkeypatch.setitem(backends.GENERATION_BACKENDS, "recorder", f"{__name__}:Recorder")
    globals()["Recorder"] = Recorder
    backends.make_generation_backend(
        tiny_model("llama"),
        1,
        engine="recorder",
        chunk_size=3,
        options={"base_url": "http://x:1", "timeout": 2.0},
    )
    assert seen["base_url"] == "http://x:1" and seen["timeout"] == 2.0 and seen["chunk_size"] == 3


def test_an_unreachable_server_stops_grpo_before_its_first_update(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    trainer = GRPOTrainer(
        tiny_model("llama"), lambda completions, **kw: [0.0] * len(completions),
        args=_grpo(
            tmp_path, use_vllm=True, vllm_mode="server", vllm_server_base_url=url, vllm_server_timeout=1,
            per_device_train_batch_size=8, num_generations=4, max_completion_length=4, max_steps=2,
            disable_tqdm=True,
        ),
        train_dataset=toy_prompt_dataset(n=8), processing_class=tiny_tokenizer(padding_side="left"),
    )  # fmt: skip
    with pytest.raises(ConnectionError, match=rf"no vLLM server answered at {url} within 1 s"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_an_unreachable_server_stops_ppo_at_construction(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    config = PPOConfig(
        batch_size=2, mini_batch_size=2, use_vllm=True, vllm_mode="server", vllm_server_base_url=url,
        vllm_server_timeout=1,
    )  # fmt: skip
    with pytest.raises(ConnectionError, match=rf"no vLLM server answered at {url}"):
        PPOTrainer(config, tiny_value_head_model("llama"), tokenizer=tiny_tokenizer(padding_side="left"))


def _grpo_trainer(tmp_path, **kwargs) -> GRPOTrainer:
    args = _grpo(
        tmp_path, use_vllm=True, vllm_mode="server", per_device_train_batch_size=4, num_generations=2,
        max_completion_length=4, max_steps=1, **kwargs,
    )  # fmt: skip
    return GRPOTrainer(
        tiny_model("llama"), lambda completions, **kw: [0.0] * len(completions), args=args,
        train_dataset=toy_prompt_dataset(n=8), processing_class=tiny_tokenizer(padding_side="left"),
    )  # fmt: skip


def _sampled_batch() -> RolloutBatch:
    """Two prompts with three-token completions and made-up sampler logprobs (-0.1 each)."""
    query_ids, query_mask = pad_left([torch.tensor([5, 6, 7]), torch.tensor([8, 9])], 1)
    responses = torch.tensor([[10, 11, 12], [13, 14, 15]])
    mask = torch.ones_like(responses, dtype=torch.bool)
    return RolloutBatch(query_ids, query_mask, responses, mask, mask, logprobs=torch.full((2, 3), -0.1))


@pytest.mark.parametrize("processed", [False, True])
def test_processed_engine_logprobs_are_never_the_old_policy(tmp_path, processed):
    # the backend says whether its logprobs are processed (`GenerationOutput`), not the trainer's top_k:
    # here the trainer's own settings would truncate nothing either way
    trainer = _grpo_trainer(tmp_path, top_k=0, vllm_importance_sampling_correction=False)
    batch, metrics = trainer._with_old_logprobs(_sampled_batch(), processed)
    assert trainer._sampler_weights(batch) is None  # the correction stays off
    if not processed:  # the engine's logprobs are the full distribution's: they serve as the old policy
        assert batch.old_logprobs is None and metrics == {}
        return
    assert metrics == {"sampling/logprobs_processed": 1.0}  # for the health alarm: no engine mismatch
    expected = forward_response(trainer.model, *_rollout(batch), temperature=1.0).logprobs
    torch.testing.assert_close(batch.old_logprobs, expected)
    assert torch.equal(trainer._old_logprobs(batch), batch.old_logprobs)


def _rollout(batch):
    return batch.query_ids, batch.query_mask, batch.responses, batch.response_mask
