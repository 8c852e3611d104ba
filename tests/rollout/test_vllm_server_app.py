"""The server's weight-update bookkeeping, without an engine: checks before a reload, and a failed reload."""

from __future__ import annotations

import threading

import pytest
import torch
from safetensors.torch import save

from rlhfkit.rollout.vllm_server import WeightUpdate, checkpoint_shapes, unexpected_weights
from rlhfkit.testing import tiny_model


class FakeEngine:
    """Records the files each reload was given; `fail` makes the reload raise, as a broken engine would."""

    def __init__(self, fail: bool = False):
        self.fail, self.reloads, self.cache_resets = fail, [], 0

    def collective_rpc(self, method, args=()):
        assert method == "rlhfkit_load_weights"
        if self.fail:
            raise RuntimeError("worker died")
        from safetensors.torch import load_file

        self.reloads.append({k: v for path in args[0] for k, v in load_file(path).items()})
        return [None]

    def reset_prefix_cache(self):
        self.cache_resets += 1


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    tiny_model("llama").save_pretrained(folder)
    return checkpoint_shapes(str(folder))


def test_checkpoint_shapes_reads_the_saved_tensors(expected):
    assert expected["model.norm.weight"] == [128] and expected["lm_head.weight"] == [1000, 128]
    assert checkpoint_shapes("not/a/folder") is None


def test_unknown_names_and_wrong_shapes_are_listed(expected, tmp_path):
    path = tmp_path / "piece.safetensors"
    path.write_bytes(save({"model.norm.weight": torch.ones(3), "model.extra": torch.ones(1)}))
    assert sorted(unexpected_weights([str(path)], expected)) == [
        "model.extra (not in the checkpoint)",
        "model.norm.weight (shape [3], the checkpoint's is [128])",
    ]
    assert unexpected_weights([str(path)], None) == []  # a hub model: nothing to check against


def test_pieces_wait_for_the_last_then_reload_once_and_reset_the_cache(expected):
    engine = FakeEngine()
    update = WeightUpdate(engine, threading.Lock(), expected)
    assert update.add(save({"model.norm.weight": torch.ones(128)}), last=False) == {"staged": 1}
    assert engine.reloads == []
    assert update.add(save({"lm_head.weight": torch.zeros(1000, 128)}), last=True) == {"loaded_files": 2}
    (reload,) = engine.reloads
    assert sorted(reload) == ["lm_head.weight", "model.norm.weight"] and engine.cache_resets == 1
    assert update.staged == [] and update.broken is None


def test_a_bad_update_is_refused_before_the_engine_sees_it(expected):
    engine = FakeEngine()
    update = WeightUpdate(engine, threading.Lock(), expected)
    with pytest.raises(ValueError, match=r"the model has no model.norm.weight \(shape \[2\]"):
        update.add(save({"model.norm.weight": torch.ones(2)}), last=True)
    with pytest.raises(ValueError, match="must be a safetensors file"):
        update.add(b"", last=True)
    assert engine.reloads == [] and update.broken is None


def test_a_reload_that_fails_marks_the_server_broken(expected):
    update = WeightUpdate(FakeEngine(fail=True), threading.Lock(), expected)
    with pytest.raises(RuntimeError, match=r"failed half-way \(worker died\): restart the server"):
        update.add(save({"model.norm.weight": torch.ones(128)}), last=True)
    assert "restart the server" in update.broken


def test_engine_keywords_from_the_flags(monkeypatch):
    from rlhfkit.commands.vllm_serve import VLLMServeArguments
    from rlhfkit.rollout.vllm_server import engine_kwargs

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    args = VLLMServeArguments(model="m", dtype="float32", speculative_config='{"method": "ngram"}')
    kwargs = engine_kwargs(args)
    assert kwargs["model"] == "m" and kwargs["dtype"] == "float32"
    assert kwargs["speculative_config"] == {"method": "ngram"}
    assert kwargs["logprobs_mode"] == "processed_logprobs"  # the distribution sampled from, as TRL's server
    assert kwargs["worker_extension_cls"] == "rlhfkit.rollout.vllm_worker.WeightLoadingExtension"
    assert "revision" not in kwargs and "max_model_len" not in kwargs  # unset: vLLM's defaults
    if not torch.cuda.is_available():  # 1 GiB of KV cache rather than 90% of all RAM
        assert kwargs["kv_cache_memory_bytes"] == 2**30
    assert (
        engine_kwargs(VLLMServeArguments(model="m", kv_cache_memory_gib=0.5))["kv_cache_memory_bytes"]
        == 2**29
    )
