"""`VLLMColocateBackend`: a vLLM engine inside the training process, sampling from the trainer's model.

The engine is built from the trainer's model itself, not from a checkpoint on disk: only its config is
written (to a temporary folder, which vLLM reads its architecture from), the engine starts with
placeholder weights (`load_format="dummy"`, no tokenizer), and the trainer's tensors are then loaded
straight into it. Its engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so
`collective_rpc` calls a function on the engine's worker directly: a weight sync hands the worker an
iterator over the trainer's tensors (LoRA merged, `engine_weights`), with no file and no HTTP between
them, and the worker reloads them as the server's does (`vllm_worker.reload_weights`).

A call samples exactly as `VLLMServerBackend` does (`vllm_common`): the same resolved settings, stop
tokens, seeds and logprobs (the engine's, at the sampling temperature). With `enable_sleep_mode` (GPU
only) the engine frees its device memory between calls for the trainer: after each `generate` it drops
its weights and KV cache (vLLM's sleep level 2), a sync wakes the weights before loading them, and a
`generate` with nothing loaded since reloads the model's current weights first.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlhfkit.rollout.backends import GenerationBackend, GenerationOutput, SamplingParams
from rlhfkit.rollout.engine_weights import engine_weights
from rlhfkit.rollout.streaming import generating_module
from rlhfkit.rollout.vllm_common import (
    cpu_scheduler_kwargs,
    engine_answer,
    engine_request,
    generation_output,
    kv_cache_kwargs,
    require_vllm,
    vllm_sampling_params,
)
from rlhfkit.rollout.vllm_worker import reload_weights

NO_VLLM_FIX = (
    "run the trainer with .venv-vllm/bin/python, or sample on a server instead: vllm_mode='server' with "
    "`.venv-vllm/bin/rlhfkit vllm-serve --model <the trainer's model>`"
)


def _check_settings(gpu_memory_utilization, tensor_parallel_size, enable_sleep_mode, value_head) -> None:
    """ValueError naming the argument, for what the colocated engine cannot do, before vLLM is imported."""
    if value_head is not None:
        raise ValueError(
            "the vLLM colocate backend returns no value-head outputs: PPO's rollout reuse needs "
            "generation_backend 'rlhfkit' or 'transformers'"
        )
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    on_cpu = not torch.cuda.is_available()
    if tensor_parallel_size != 1:
        where = "on CPU" if on_cpu else "in colocate mode yet"
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} is not supported {where}: the colocated engine "
            "runs in the trainer's one process; use tensor_parallel_size=1, or vllm_mode='server' with "
            "`rlhfkit vllm-serve --tensor_parallel_size N`"
        )
    if enable_sleep_mode and on_cpu:
        raise ValueError(
            "enable_sleep_mode needs a GPU: vLLM refuses sleep mode on CPU (there is no device memory to "
            "hand back to the trainer); leave it False"
        )


def _engine_folder(net: torch.nn.Module, tokenizer: Any = None) -> tempfile.TemporaryDirectory:
    """A temporary folder holding `net`'s config.json, the file the engine is built from, and `tokenizer`'s
    files when given (structured outputs need it)."""
    folder = tempfile.TemporaryDirectory(prefix="rlhfkit-vllm-")
    config = json.loads(net.config.to_json_string())
    config["architectures"] = [type(net).__name__]  # how vLLM picks its model class
    (Path(folder.name) / "config.json").write_text(json.dumps(config))
    if tokenizer is not None:
        tokenizer.save_pretrained(folder.name)
    return folder


class VLLMColocateBackend(GenerationBackend):
    """Samples on a vLLM engine in this process, built from `model` (see the module docstring).

    `gpu_memory_utilization`: on GPU, the share of the device the engine may take; on CPU, where vLLM
    would reserve that share of all RAM, the KV cache gets 1 GiB instead (or `VLLM_CPU_KVCACHE_SPACE`
    GiB when set). `max_model_length`: longest prompt + completion (None: the model's own limit).
    `chunk_size` and `progress` are accepted for the common constructor and unused. With
    `structured_outputs_regex` every completion matches that regular expression (vLLM's structured
    outputs); the engine then needs `tokenizer` (without one it gets none: token ids in and out).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        pad_token_id: int,
        *,
        gpu_memory_utilization: float = 0.3,
        tensor_parallel_size: int = 1,
        max_model_length: int | None = None,
        enable_sleep_mode: bool = False,
        model_impl: str = "vllm",
        chunk_size: int | None = None,
        value_head: torch.nn.Module | None = None,
        weights_context: Callable[[], contextlib.AbstractContextManager] | None = None,
        progress: Callable[[int], None] | None = None,
        structured_outputs_regex: str | None = None,
        tokenizer: Any = None,
    ):
        _check_settings(gpu_memory_utilization, tensor_parallel_size, enable_sleep_mode, value_head)
        if structured_outputs_regex is not None and tokenizer is None:
            raise ValueError(
                "structured_outputs_regex needs the tokenizer (tokenizer=...): the engine matches the "
                "regular expression against the text of each token"
            )
        require_vllm("vllm_mode='colocate'", NO_VLLM_FIX)
        self.model, self.pad_token_id = model, pad_token_id
        self.weights_context = weights_context or contextlib.nullcontext
        self.enable_sleep_mode, self.structured_outputs_regex = enable_sleep_mode, structured_outputs_regex
        net = generating_module(model)
        self._folder = _engine_folder(net, tokenizer)  # kept while the engine lives
        self.llm = self._start_engine(
            skip_tokenizer_init=tokenizer is None,  # prompts arrive as token ids and only ids come back
            dtype=str(next(net.parameters()).dtype).removeprefix("torch."),
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_length,
            enable_sleep_mode=enable_sleep_mode,
            model_impl=model_impl,
        )
        self._weights_asleep = False
        self.sync_weights()  # the engine starts with placeholder weights
        if enable_sleep_mode:
            self._sleep()

    def _start_engine(self, **settings: Any) -> Any:
        from vllm import LLM

        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
        on_cpu = not torch.cuda.is_available()
        kwargs = dict(
            model=self._folder.name,
            load_format="dummy",  # the trainer's weights are loaded next, from memory
            tensor_parallel_size=1,
            enforce_eager=on_cpu,  # no torch.compile warm-up on CPU, where it costs minutes
            logprobs_mode="processed_logprobs",  # the logprobs of what was sampled from, as the server's
            **kv_cache_kwargs(),
            **cpu_scheduler_kwargs(),
            **settings,
        )
        return LLM(**{k: v for k, v in kwargs.items() if v is not None})

    def _sleep(self) -> None:
        self.llm.sleep(level=2)  # weights and KV cache dropped: the next sync or generate reloads
        self._weights_asleep = True

    def _sample(self, query_ids, query_mask, params: SamplingParams, logprob_temperature) -> GenerationOutput:
        request = engine_request(
            self.model,
            self.pad_token_id,
            query_ids,
            query_mask,
            params,
            logprob_temperature,
            self.structured_outputs_regex,
        )
        if self._weights_asleep:  # nothing synced since the last call dropped them
            self.sync_weights()
        if self.enable_sleep_mode:
            self.llm.wake_up(tags=["kv_cache"])
        prompts = [{"prompt_token_ids": ids} for ids in request["prompt_token_ids"]]
        outputs = self.llm.generate(prompts, vllm_sampling_params(request), use_tqdm=False)
        if self.enable_sleep_mode:
            self._sleep()
        answer = engine_answer(outputs, request["logprobs"])
        return generation_output(answer, request, self.pad_token_id, query_ids.device)

    def sync_weights(self, model: torch.nn.Module | None = None) -> None:
        """Load `model`'s current weights (default: this backend's model) into the engine, LoRA merged."""
        model = self.model if model is None else model
        if self._weights_asleep:
            self.llm.wake_up(tags=["weights"])
            self._weights_asleep = False
        with self.weights_context():
            self.llm.collective_rpc(reload_weights, args=(engine_weights(model),))
        self.llm.reset_prefix_cache()  # its keys and values came from the old weights
