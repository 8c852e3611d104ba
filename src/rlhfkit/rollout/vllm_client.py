"""`VLLMServerBackend`: trainers sample from a `rlhfkit vllm-serve` server, over HTTP only.

The server runs in its own venv (vLLM pins an older transformers), so this side imports no vLLM. The
backend samples from the distribution the other backends do: the sampling settings are resolved the same
way (ours over the model's generation_config, `DecodeSettings.resolve`) and sent explicitly, and a row
stops at the resolved stop tokens only (`ignore_eos`: the engine's own eos rule is off).

Where it departs: the logprobs are the engine's, of the distribution it sampled from (after temperature,
repetition penalty, top-k/top-p/min-p), so they equal the contract's softmax(raw logits / temperature)
only when none of those truncate or penalise; and they are at the sampling temperature (greedy: 1), so
another `logprob_temperature` is refused. Before any sampling the server is checked: it must answer
within `timeout` and serve a model of the trainer's architecture, sizes and vocabulary.
`sync_weights(model)` sends the trainer's current weights (LoRA merged) to the engine.

A server that dies or stops answering mid-run raises `VLLMServerLost` (the URL, and how to go on): a
refused connection at once, a silent server after `request_timeout` seconds (long enough for a real
generation or weight reload, but finite, so that a run never hangs).
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import torch

from rlhfkit.rollout.backends import GenerationBackend, GenerationOutput, SamplingParams
from rlhfkit.rollout.engine_weights import engine_weights, engine_weights_by_module
from rlhfkit.rollout.streaming import generating_module
from rlhfkit.rollout.vllm_common import engine_request, generation_output

WEIGHT_PIECE_BYTES = 256 * 2**20  # largest safetensors piece one weight-update request carries
REQUEST_TIMEOUT = 1800.0  # seconds one generate or weight-update request may take before the server is lost


class VLLMServerError(RuntimeError):
    """The vLLM server refused a request or could not be reached."""


class VLLMServerUnreachable(VLLMServerError):
    """No answer from the vLLM server: connection refused or reset, or silent past the timeout."""


class VLLMServerLost(VLLMServerError):
    """The vLLM server stopped answering during training; the run cannot go on without it."""


def server_lost(base_url: str, doing: str, err: Exception) -> VLLMServerLost:
    """The error a trainer stops with when the server at `base_url` is gone while `doing` something."""
    return VLLMServerLost(
        f"the vLLM server at {base_url} stopped answering while {doing} ({err}). The run stops here; its "
        "checkpoints are complete (one is written whole or not at all). Restart the server on the "
        "latest checkpoint's model (`rlhfkit vllm-serve --model <output_dir>/checkpoint-<step>` or on the "
        "starting model; the trainer sends its weights before sampling), then train again with "
        "resume_from_checkpoint=True (--resume_from_checkpoint true)"
    )


def _call(url: str, payload: Any = None, *, body: bytes | None = None, timeout: float | None = None) -> Any:
    """GET `url` (no payload) or POST JSON `payload` / raw `body`; the decoded JSON answer."""
    headers, data = {}, None
    if payload is not None:
        headers["Content-Type"], data = "application/json", json.dumps(payload).encode()
    elif body is not None:
        headers["Content-Type"], data = "application/octet-stream", body
    method = "GET" if data is None else "POST"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")
        with contextlib.suppress(ValueError):
            detail = json.loads(detail).get("detail", detail)
        raise VLLMServerError(f"the vLLM server refused {url} ({err.code}): {detail}") from err
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:  # refused, reset, timed out
        raise VLLMServerUnreachable(f"the vLLM server at {url} could not be reached: {err!r}") from err


def wait_for_server(base_url: str, timeout: float) -> dict[str, Any]:
    """The server's `/info/`, once its `/health/` answers; ConnectionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _call(f"{base_url}/health/", timeout=max(1.0, min(10.0, timeout)))
            return _call(f"{base_url}/info/", timeout=30)
        except VLLMServerError as err:
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"no vLLM server answered at {base_url} within {timeout:g} s ({err}). Start one with "
                    "`.venv-vllm/bin/rlhfkit vllm-serve --model <the trainer's model>` (`make vllm-env` "
                    "builds .venv-vllm), point vllm_server_base_url (or vllm_server_host and "
                    "vllm_server_port) at it, or wait longer with vllm_server_timeout"
                ) from err
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _model_facts(net: torch.nn.Module) -> dict[str, Any]:
    """What `/info/` reports, for the trainer's generating model."""
    config = net.config.get_text_config()
    return {
        "model": getattr(net, "name_or_path", None) or type(net).__name__,
        "architectures": [_model_class(net).__name__],
        "vocab_size": config.vocab_size,
        "hidden_size": getattr(config, "hidden_size", None),
        "num_hidden_layers": getattr(config, "num_hidden_layers", None),
    }


def _model_class(net: torch.nn.Module) -> type:
    """`net`'s model class; under FSDP2 the class it wraps (`fully_shard` makes a class `FSDP<name>`)."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(net, FSDPModule):
        return type(net)
    return next(c for c in type(net).__mro__ if not issubclass(c, FSDPModule))


def check_same_model(info: dict[str, Any], model: torch.nn.Module, base_url: str) -> None:
    """ValueError naming both models when the server's model is not the trainer's (architecture, sizes)."""
    ours = _model_facts(generating_module(model))
    differ = [
        key
        for key in ("vocab_size", "hidden_size", "num_hidden_layers")
        if info.get(key) is not None and ours[key] is not None and info[key] != ours[key]
    ]
    if info.get("architectures") and ours["architectures"][0] not in info["architectures"]:
        differ.insert(0, "architectures")
    if differ:
        theirs = ", ".join(f"{key} {info.get(key)}" for key in differ)
        mine = ", ".join(f"{key} {ours[key]}" for key in differ)
        raise ValueError(
            f"the vLLM server at {base_url} serves {info.get('model')} ({theirs}), but the trainer's model "
            f"is {ours['model']} ({mine}): start the server with --model {ours['model']}"
        )


class VLLMServerBackend(GenerationBackend):
    """Samples on a `rlhfkit vllm-serve` server at `base_url` (see the module docstring).

    `chunk_size` and `progress` are accepted for the common constructor and unused: the engine batches
    the whole call itself. With several training processes only one `sends_weights`; the others' syncs
    only take part in gathering sharded weights (a collective), then send nothing. With `gather_module`
    (ZeRO-3, FSDP2: `sharding.module_gatherer`) a sync gathers one module at a time, not the whole model
    (a LoRA layer with its adapters, for its merge).
    A `value_head` cannot be served (the engine returns no hidden states). With `structured_outputs_regex`
    every completion matches that regular expression (vLLM's structured outputs, on the server's tokenizer).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        pad_token_id: int,
        *,
        base_url: str = "http://localhost:8000",
        timeout: float = 240.0,
        request_timeout: float = REQUEST_TIMEOUT,
        sends_weights: bool = True,
        gather_module: Callable[[list[torch.nn.Parameter]], contextlib.AbstractContextManager] | None = None,
        chunk_size: int | None = None,
        value_head: torch.nn.Module | None = None,
        weights_context: Callable[[], contextlib.AbstractContextManager] | None = None,
        progress: Callable[[int], None] | None = None,
        structured_outputs_regex: str | None = None,
    ):
        if value_head is not None:
            raise ValueError(
                "the vLLM server backend returns no value-head outputs: PPO's rollout reuse needs "
                "generation_backend 'rlhfkit' or 'transformers'"
            )
        for name, seconds in (("timeout", timeout), ("request_timeout", request_timeout)):
            if not seconds > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {seconds!r}")
        self.model, self.pad_token_id = model, pad_token_id
        self.request_timeout, self.sends_weights = request_timeout, sends_weights
        self.gather_module, self.structured_outputs_regex = gather_module, structured_outputs_regex
        self.base_url = base_url.rstrip("/")
        self.weights_context = weights_context or contextlib.nullcontext
        self.info = wait_for_server(self.base_url, timeout)
        check_same_model(self.info, model, self.base_url)

    def _sample(self, query_ids, query_mask, params: SamplingParams, logprob_temperature) -> GenerationOutput:
        body = engine_request(
            self.model,
            self.pad_token_id,
            query_ids,
            query_mask,
            params,
            logprob_temperature,
            self.structured_outputs_regex,
        )
        with self._lost_if_unreachable("sampling"):
            answer = _call(f"{self.base_url}/generate/", body, timeout=self.request_timeout)
        return generation_output(answer, body, self.pad_token_id, query_ids.device)

    def sync_weights(self, model: torch.nn.Module | None = None) -> None:
        """Load `model`'s current weights (default: this backend's model) into the engine, LoRA merged.

        Sent in safetensors pieces of at most `WEIGHT_PIECE_BYTES` (one tensor larger than that goes
        alone), so at most two pieces are copied at a time; the engine reloads once, from all of them.
        """
        model = self.model if model is None else model
        if self.gather_module is None:
            weights, gathered = engine_weights(model), self.weights_context()
        else:  # ZeRO-3, FSDP2: one module (a LoRA layer with its adapters) gathered at a time, while sent
            weights = engine_weights_by_module(model, self.gather_module, WEIGHT_PIECE_BYTES)
            gathered = contextlib.nullcontext()
        if not self.sends_weights:
            with gathered:  # every process must join the gathering of sharded weights
                collections.deque(weights, maxlen=0)
            return
        url, timeout = f"{self.base_url}/update_weights/", self.request_timeout
        with gathered, self._lost_if_unreachable("loading the policy's weights"):
            pieces = _pieces(weights, WEIGHT_PIECE_BYTES)
            piece = next(pieces)
            for following in pieces:  # one piece ahead: the last one tells the server to reload
                _call(f"{url}?last=false", body=piece, timeout=timeout)
                piece = following
            _call(f"{url}?last=true", body=piece, timeout=timeout)

    @contextlib.contextmanager
    def _lost_if_unreachable(self, doing: str) -> Iterator[None]:
        """`VLLMServerLost` (what to do next) in place of an unreachable server while `doing` something."""
        try:
            yield
        except VLLMServerUnreachable as err:
            raise server_lost(self.base_url, doing, err) from err


def _pieces(weights: Iterator[tuple[str, torch.Tensor]], limit: int) -> Iterator[bytes]:
    """Safetensors files of consecutive tensors of `weights`, each at most `limit` bytes when it can be."""
    from safetensors.torch import save

    piece: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if piece and size + nbytes > limit:
            yield save(piece)
            piece, size = {}, 0
        piece[name] = tensor.detach().to("cpu").contiguous().clone()  # its own storage: tied weights too
        size += nbytes
    if piece:
        yield save(piece)
