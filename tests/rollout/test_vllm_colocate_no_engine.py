"""The colocate backend without an engine: its refusals (raised before vLLM is needed), the tied-layer
refresh after a reload, and the order in which sleep mode drops and reloads the engine's weights (on a
recording stand-in for vLLM's `LLM`)."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest
import torch

from rlhfkit.rollout import SamplingParams, make_generation_backend, vllm_colocate
from rlhfkit.rollout.vllm_colocate import VLLMColocateBackend
from rlhfkit.testing import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def test_asking_for_the_colocate_backend_without_vllm_names_both_fixes(model, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails, as in the trainer's venv
    with pytest.raises(ImportError) as err:
        make_generation_backend(model, 1, engine="vllm-colocate")
    message = str(err.value)
    assert message.startswith("vllm_mode='colocate' needs vLLM")
    assert "`make vllm-env` builds .venv-vllm" in message and "vllm_mode='server'" in message


def test_an_untested_vllm_version_is_refused(model, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.11.0"))
    with pytest.raises(ImportError, match=r"vLLM 0.11.0 is not supported by vllm_mode='colocate'"):
        VLLMColocateBackend(model, 1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"enable_sleep_mode": True}, r"enable_sleep_mode needs a GPU: vLLM refuses sleep mode on CPU"),
        ({"tensor_parallel_size": 2}, r"tensor_parallel_size=2 is not supported on CPU.*vllm_mode='server'"),
        ({"gpu_memory_utilization": 0.0}, r"gpu_memory_utilization must be in \(0, 1\], got 0.0"),
        ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization must be in \(0, 1\], got 1.5"),
        ({"value_head": torch.nn.Linear(2, 1)}, r"returns no value-head outputs"),
    ],
)
def test_what_the_colocated_engine_cannot_do_on_cpu_is_refused_naming_the_argument(
    model, monkeypatch, kwargs, message
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "vllm", None)  # refused before vLLM is even looked for
    with pytest.raises(ValueError, match=message):
        VLLMColocateBackend(model, 1, **kwargs)


class RecordingEngine:
    """Stands in for vLLM's `LLM`: records the calls the backend makes, and runs its weight loads."""

    def __init__(self):
        self.calls: list[str] = []

    def collective_rpc(self, method, args=()):
        def reload_weights(weights_iterator):
            self.calls.append(f"load {len(list(weights_iterator))} tensors")

        runner = SimpleNamespace(model=torch.nn.Linear(2, 2))  # the engine's model: nothing tied
        method(SimpleNamespace(reload_weights=reload_weights, model_runner=runner), *args)

    def reset_prefix_cache(self):
        self.calls.append("reset prefix cache")

    def sleep(self, level):
        self.calls.append(f"sleep {level}")

    def wake_up(self, tags):
        self.calls.append(f"wake {' '.join(tags)}")

    def generate(self, prompts, params, use_tqdm):
        self.calls.append("generate")
        done = SimpleNamespace(token_ids=[7, 2], logprobs=None, finish_reason="stop")
        return [SimpleNamespace(outputs=[done]) for _ in prompts]


def test_sleep_mode_drops_the_weights_after_sampling_and_reloads_them_before_the_next_call(
    model, monkeypatch
):
    import peft.tuners.lora  # noqa: F401  (imported before CUDA is faked: bitsandbytes would look for it)

    engine = RecordingEngine()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # sleep mode is a GPU feature
    monkeypatch.setattr(vllm_colocate, "require_vllm", lambda *args: "0.32.0")
    monkeypatch.setattr(VLLMColocateBackend, "_start_engine", lambda self, **settings: engine)
    monkeypatch.setattr(vllm_colocate, "vllm_sampling_params", lambda request: None)
    backend = VLLMColocateBackend(model, 1, enable_sleep_mode=True)
    load = f"load {len(model.state_dict())} tensors"
    assert engine.calls == [load, "reset prefix cache", "sleep 2"]  # built, loaded, then asleep

    prompt = torch.tensor([[5, 6, 7]])
    params = SamplingParams(max_new_tokens=3, top_k=0)
    engine.calls.clear()
    out = backend.generate(prompt, torch.ones_like(prompt), params)
    # nothing synced since the weights were dropped: the model's current weights are loaded first
    assert engine.calls == [
        "wake weights", load, "reset prefix cache", "wake kv_cache", "generate", "sleep 2"
    ]  # fmt: skip
    assert out.responses.tolist() == [[7, 2, 1]] and out.response_mask.tolist() == [[True, True, False]]

    engine.calls.clear()
    backend.sync_weights()  # after an optimizer step
    backend.generate(prompt, torch.ones_like(prompt), params)
    assert engine.calls == [
        "wake weights", load, "reset prefix cache", "wake kv_cache", "generate", "sleep 2"
    ]  # fmt: skip
    engine.calls.clear()
    backend.sync_weights()
    backend.sync_weights()  # a second sync loads again, with nothing to wake
    assert engine.calls == ["wake weights", load, "reset prefix cache", load, "reset prefix cache"]


def test_without_sleep_mode_the_engine_keeps_its_weights_between_calls(model, monkeypatch):
    engine = RecordingEngine()
    monkeypatch.setattr(vllm_colocate, "require_vllm", lambda *args: "0.32.0")
    monkeypatch.setattr(VLLMColocateBackend, "_start_engine", lambda self, **settings: engine)
    monkeypatch.setattr(vllm_colocate, "vllm_sampling_params", lambda request: None)
    backend = VLLMColocateBackend(model, 1)
    prompt = torch.tensor([[5, 6, 7]])
    engine.calls.clear()
    backend.generate(prompt, torch.ones_like(prompt), SamplingParams(max_new_tokens=3, top_k=0))
    backend.generate(prompt, torch.ones_like(prompt), SamplingParams(max_new_tokens=3, top_k=0))
    assert engine.calls == ["generate", "generate"]


def test_a_reload_redoes_the_after_loading_step_of_tied_layers_only():
    from rlhfkit.rollout.vllm_worker import reload_weights

    redone = []

    class Layer(torch.nn.Linear):
        def __init__(self, name):
            super().__init__(4, 4, bias=False)
            self.quant_method = SimpleNamespace(process_weights_after_loading=lambda m: redone.append(name))

    embed, head, other = Layer("embed"), Layer("head"), Layer("other")
    head.weight = embed.weight  # tied, as an lm_head sharing the input embedding
    net = torch.nn.ModuleDict({"embed": embed, "layer": other, "head": head})
    loaded = []
    worker = SimpleNamespace(
        reload_weights=lambda weights_iterator: loaded.extend(weights_iterator),
        model_runner=SimpleNamespace(model=net),
    )
    reload_weights(worker, iter([("embed.weight", torch.ones(4, 4))]))
    assert [name for name, _ in loaded] == ["embed.weight"] and sorted(redone) == ["embed", "head"]
