"""Response logprobs from a causal LM's final hidden states, projected in tiles (no (B, T, V) logits).

`find_lm_head` looks through the wrappers a policy may come in (DDP, the value-head wrapper, a PEFT
model) to the transformers model and returns its output head when the logits are exactly
`lm_head(last_hidden_state) * scale` with a plain `nn.Linear` head; otherwise it returns None and logs
why, once per model class, so the caller keeps the full-logits path.

`chunked_response_outputs` then runs the model's own forward (so wrappers, adapters, gradient
checkpointing and DDP hooks behave as usual) with `logits_to_keep=1`, catches the backbone's final
hidden states with a forward hook (`forward_hidden`), and scores the response tokens with
`chunked_token_logprobs`; `chunked_label_logprobs` does the same for causal-LM labels (DPO, SFT).
"""

from __future__ import annotations

import logging
from collections.abc import Container
from dataclasses import dataclass

import torch
from torch import nn

from rlhfkit.core.chunked_logprobs import chunked_token_logprobs
from rlhfkit.rollout.host_memory import trim_heap

logger = logging.getLogger(__name__)

# Causal LMs whose forward is `lm_head(backbone(...).last_hidden_state[:, slice])`, checked by reading
# their transformers modeling code; value: config attribute and whether the logits are multiplied (True)
# or divided (False) by it.
_PLAIN_HEAD_MODEL_TYPES = {
    "gemma": None,
    "gpt2": None,
    "gpt_neox": None,
    "llama": None,
    "mistral": None,
    "mixtral": None,
    "olmo2": None,
    "opt": None,
    "phi3": None,
    "qwen2": None,
    "qwen2_moe": None,
    "qwen3": None,
    "qwen3_moe": None,
    "smollm3": None,
    "cohere": ("logit_scale", True),
    "granite": ("logits_scaling", False),
}
_SHARDING_WRAPPERS = ("FullyShardedDataParallel", "DeepSpeedEngine")
_logged_fallbacks: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class LMHead:
    """A causal LM's output projection: logits = (hidden @ weight.T + bias) * logit_scale."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    logit_scale: float
    backbone: nn.Module  # its output's last_hidden_state is what the head projects
    module: nn.Linear  # the head itself


def _unwrap(model: nn.Module) -> tuple[nn.Module, str | None]:
    """The transformers model inside DDP / value-head / PEFT wrappers, or a reason to fall back."""
    for _ in range(8):  # a few nested wrappers at most
        name = type(model).__name__
        if name in _SHARDING_WRAPPERS or name.startswith("FSDP"):
            return model, f"{name} shards the head weight outside its forward"
        if name == "OptimizedModule":
            return (
                model,
                "a torch.compile'd model may not run the backbone hook that catches the hidden states",
            )
        if name == "DistributedDataParallel":
            model = model.module
        elif hasattr(model, "v_head") and hasattr(model, "pretrained_model"):
            model = model.pretrained_model
        elif any(cls.__name__ == "PeftModel" for cls in type(model).__mro__):
            if getattr(model.active_peft_config, "is_prompt_learning", False):
                return model, "a prompt-learning PEFT adapter adds virtual tokens to the sequence"
            model = model.get_base_model()
        else:
            return model, None
    return model, "too many nested wrappers"


def known_base_model(model: nn.Module, known_model_types: Container[str], needed: str) -> nn.Module | str:
    """The transformers model inside `model`'s wrappers when its `model_type` is one of `known_model_types`;
    otherwise the reason why not (a wrapper that changes the computation, or a type not known to `needed`)."""
    base, reason = _unwrap(model)
    if reason is not None:
        return reason
    model_type = getattr(getattr(base, "config", None), "model_type", None)
    if model_type not in known_model_types:
        return f"model_type {model_type!r} is not known to {needed}"
    return base


def _inspect(model: nn.Module) -> LMHead | str:
    base = known_base_model(model, _PLAIN_HEAD_MODEL_TYPES, "project last_hidden_state with a plain head")
    if isinstance(base, str):
        return base
    config = base.config
    model_type = config.model_type
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "is_encoder_decoder", False):
        return "its logits are soft-capped or come from a decoder with its own head"
    head = base.get_output_embeddings()
    if (
        type(head) is not nn.Linear
    ):  # exact type: LoRA, quantised and modules_to_save heads are subclasses or wrappers
        return f"its output head is {type(head).__name__}, not a plain torch.nn.Linear"
    backbone = getattr(base, getattr(base, "base_model_prefix", ""), None)
    if not isinstance(backbone, nn.Module):
        return "its backbone module was not found"
    scale = 1.0
    scaling = _PLAIN_HEAD_MODEL_TYPES[model_type]
    if scaling is not None:
        value = float(getattr(config, scaling[0]))
        scale = value if scaling[1] else 1.0 / value
    return LMHead(head.weight, head.bias, scale, backbone, head)


def warn_fallback_once(
    log: logging.Logger, seen: set[tuple[str, str]], model: nn.Module, instead: str, reason: str
) -> None:
    """Warn that `model` is scored `instead` because of `reason`, once per (model class, reason) in `seen`."""
    key = (type(model).__name__, reason)
    if key not in seen:
        seen.add(key)
        log.warning("%s: scoring %s, because %s", key[0], instead, reason)


def find_lm_head(model: nn.Module) -> LMHead | None:
    """The model's plain linear output head, or None (the reason logged once per model class)."""
    found = _inspect(model)
    if isinstance(found, LMHead):
        return found
    warn_fallback_once(logger, _logged_fallbacks, model, "with full logits", found)
    return None


def _last_hidden_state(output) -> torch.Tensor:
    hidden = getattr(output, "last_hidden_state", None)
    return hidden if hidden is not None else output[0]


def forward_hidden(model: nn.Module, head: LMHead, **inputs) -> tuple[object, torch.Tensor]:
    """The model's own forward on `inputs` and its backbone's (B, T, H) final hidden states.

    Only one position goes through the vocabulary projection (`logits_to_keep=1`): the caller projects the
    hidden rows it needs in chunks, so the output's logits are not the (B, T, V) ones. That position's rows
    reach the head contiguous: torch's CPU linear on the strided (B, 1, H) slice of a frozen weight expands
    the weight per row (a (B, H, V) copy: seconds and gigabytes for a bfloat16 152k-token head).
    """
    captured: list[torch.Tensor] = []
    hook = head.backbone.register_forward_hook(lambda _m, _a, out: captured.append(_last_hidden_state(out)))
    contiguous = head.module.register_forward_pre_hook(lambda _m, args: (args[0].contiguous(), *args[1:]))
    try:
        output = model(**inputs, logits_to_keep=1)
    finally:
        hook.remove()
        contiguous.remove()
    return output, captured[-1]


def head_token_logprobs(
    head: LMHead,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    with_entropy: bool = False,
):
    """`chunked_token_logprobs` through `head`, its logit scale folded into the temperature.

    In a pass that will be differentiated, the heap pages its forward freed go back to the OS first
    (`host_memory.trim_heap`): backward then holds the weight's gradient beside the model's gradients. At a
    152k vocabulary it lowered the benchmark's PPO and RLOO peaks by 1 to 24 MiB (measured at 4200a86;
    `git show 39778f3:benchmarks/FINDINGS.md`).
    """
    result = chunked_token_logprobs(
        hidden,
        head.weight,
        head.bias,
        targets,
        temperature=temperature / head.logit_scale,
        chunk_rows=chunk_rows,
        with_entropy=with_entropy,
    )
    if torch.is_grad_enabled() and hidden.requires_grad:
        trim_heap(targets.numel() * head.weight.shape[0] * 4)  # the (N, V) float32 logits this path avoided
    return result


def chunked_label_logprobs(
    model: nn.Module,
    labels: torch.Tensor,
    *,
    ignore_index: int = -100,
    with_mean_logits: bool = False,
    chunk_rows: int | None = None,
    **inputs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """Causal-LM log-probs of the next label at every position, projected in chunks from the hidden states.

    Args:
        labels: (N, T) token ids, `ignore_index` where nothing is scored; position t is scored on
            labels[t + 1], as transformers' causal-LM loss shifts them.
        inputs: the model's forward keywords (input_ids, attention_mask, position_ids, use_cache, ...).
        with_mean_logits: also return each position's logit averaged over the vocabulary, a logged
            statistic: mean_v (h W_v + b_v) * s = (h . mean_v W_v + mean_v b_v) * s, so no vocabulary pass.
    Returns:
        (logprobs (N, T-1) float32, 0 where not scored; mask (N, T-1) bool, True = scored;
        mean logits (N, T-1) float32 without gradient, or None), or None when `find_lm_head(model)` is None:
        the caller then computes full logits. Only the scored rows are projected.
    """
    head = find_lm_head(model)
    if head is None:
        return None
    _, hidden = forward_hidden(model, head, **inputs)
    hidden, targets = hidden[:, :-1], labels[:, 1:].to(hidden.device)
    mask = targets != ignore_index
    scored = head_token_logprobs(head, hidden[mask], targets[mask], chunk_rows=chunk_rows)
    logprobs = torch.zeros(mask.shape, dtype=scored.dtype, device=scored.device).masked_scatter(mask, scored)
    mean_logits = None
    if with_mean_logits:
        with torch.no_grad():
            mean_row = head.weight.sum(0, dtype=torch.float32) / head.weight.shape[0]
            mean_bias = 0.0 if head.bias is None else head.bias.float().mean()
            mean_logits = (hidden.float() @ mean_row + mean_bias) * head.logit_scale
    return logprobs, mask, mean_logits


def chunked_response_outputs(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
    responses: torch.Tensor, *, temperature: float = 1.0, with_values: bool = False,
    with_entropy: bool = False, chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:  # fmt: skip
    """Per-response-token (logprobs, values, entropy), each (B, R) float32 or None when not asked for.

    Args:
        input_ids, attention_mask, position_ids: (B, Lq + R) query followed by response, as the
            full-logits path builds them; responses: (B, R), the last R columns of input_ids.
        temperature: logits are divided by it, matching the sampling distribution.
    Returns None when `find_lm_head(model)` is None: the caller then computes full logits.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if input_ids.dim() != 2 or responses.dim() != 2 or responses.shape[1] >= input_ids.shape[1]:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} must be (B, Lq + R) with Lq > 0 for responses "
            f"{tuple(responses.shape)}"
        )
    head = find_lm_head(model)
    if head is None:
        return None
    output, hidden = forward_hidden(
        model,
        head,
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    )
    # position t predicts token t+1: response tokens are predicted from positions Lq-1 .. Lq+R-2
    window = slice(-(responses.shape[1] + 1), -1)
    values = None
    if with_values:
        if not isinstance(output, tuple):
            raise ValueError(
                "with_values=True needs a model with a value head (e.g. AutoModelForCausalLMWithValueHead)"
            )
        values = output[2][:, window].float()
    result = head_token_logprobs(head, hidden[:, window], responses, temperature, chunk_rows, with_entropy)
    logprobs, entropy = result if with_entropy else (result, None)
    return logprobs, values, entropy
