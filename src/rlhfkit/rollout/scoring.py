"""Forward passes that score rollouts: per-token logprobs (and values, entropy) and reward-model scores.

Position ids follow the attention mask (cumsum - 1), exactly as `generate` builds them, so a left-padded
query gets the same logprobs whatever its padding or the chunk it is scored in.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch

from rlhfkit.core.logprobs import entropy_from_logits, selective_log_softmax
from rlhfkit.core.masking import last_true_indices, position_ids_from_mask
from rlhfkit.models.peft_detection import peft_model_of, without_peft
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.rollout.generation import is_encoder_decoder
from rlhfkit.rollout.lm_head import chunked_response_outputs
from rlhfkit.rollout.onednn_linear import with_onednn_linears
from rlhfkit.rollout.packing import maybe_pack, packed_chunked_outputs, packed_logits_and_values


@dataclass
class ForwardOutput:
    """Per-response-token outputs, each (B, R); optional ones are None when not asked for."""

    logprobs: torch.Tensor
    values: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    logits: torch.Tensor | None = None


def forward_accepts(model: torch.nn.Module, name: str) -> bool:
    """Whether the model's forward takes keyword `name` (e.g. `logits_to_keep`).

    Looks through the wrappers that pass keyword arguments on unchanged (DDP, FSDP, DeepSpeed's engine,
    PEFT), so a wrapped policy and its unwrapped reference take the same path and round alike.
    """
    for _ in range(8):  # a few nested wrappers at most
        if type(model).__name__ in ("DistributedDataParallel", "FullyShardedDataParallel", "DeepSpeedEngine"):
            model = model.module
        elif peft_model_of(model) is model:
            model = without_peft(model)
        else:
            break
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _split_output(output) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits and values from either a value-head wrapper's tuple or a transformers output object."""
    if isinstance(output, tuple):
        logits, _, values = output
        return logits, values
    return output.logits, None


# Batches with more logits than this take the chunked head. In benchmarks/head_crossover.json, above 16 MiB of
# float32 logits the chunked pass was as fast as building them or faster in every case timed; below it, often
# slower, for a few MiB saved.
CHUNKED_HEAD_MIN_LOGITS = 1 << 22


def prefers_chunked_head(model: torch.nn.Module, tokens: int) -> bool:
    """Whether `tokens` rows of vocabulary logits are many enough for the chunked head (`rollout.lm_head`).

    The vocabulary size is looked up through DDP-style wrappers (`.module`), so a wrapped policy and its
    unwrapped reference take the same path; a model whose size is unknown takes the chunked one.
    """
    vocab = None
    while model is not None and vocab is None:
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        model = getattr(model, "module", None)
    return not isinstance(vocab, int) or tokens * vocab > CHUNKED_HEAD_MIN_LOGITS


def _encoder_decoder_logits(model, query_ids, query_mask, responses, response_mask):
    """(B, R, V) logits and values (or None) of an encoder-decoder reading the responses as decoder input."""
    start = model.config.decoder_start_token_id
    decoder_ids = torch.cat([torch.full_like(responses[:, :1], start), responses[:, :-1]], dim=1)
    decoder_mask = torch.cat([torch.ones_like(response_mask[:, :1]), response_mask[:, :-1]], dim=1)
    output = model(
        input_ids=query_ids,
        attention_mask=query_mask,
        decoder_input_ids=decoder_ids,
        decoder_attention_mask=decoder_mask.long(),
    )
    return _split_output(output)


def _padded_logits(model, input_ids, attention_mask, position_ids, length_r: int, with_values: bool):
    """(B, R, V) logits and (B, R) values (or None) at the response positions of a padded
    query+response batch."""
    kwargs = {}
    if not with_values and forward_accepts(model, "logits_to_keep"):
        kwargs["logits_to_keep"] = length_r + 1  # skip the vocabulary projection over the query
    output = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        **kwargs,
    )
    logits, values = _split_output(output)
    # position t predicts token t+1: the response tokens are predicted from positions Lq-1 .. Lq+R-2
    logits = logits[:, -(length_r + 1) : -1]
    if values is not None:
        values = values[:, input_ids.shape[1] - length_r - 1 : -1]  # from the last query position on
    return logits, values


@with_onednn_linears  # on a CPU: oneDNN for the large matrices, forward and backward
def forward_response(
    model: torch.nn.Module,
    query_ids: torch.Tensor,
    query_mask: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_values: bool = False,
    with_entropy: bool = False,
    return_logits: bool = False,
    packed: bool | None = None,
    entropy_grad: bool = False,
) -> ForwardOutput:
    """One forward pass over query+response; outputs aligned with the response tokens.

    Args:
        query_ids, query_mask: (B, Lq) left-padded queries.
        responses, response_mask: (B, R) right-padded responses (mask True = real token).
        temperature: logits are divided by it, matching the sampling distribution.
    Returns:
        ForwardOutput with logprobs (B, R) float32, and values / entropy / logits when requested.
        Values are those of the state before each response token; entropy is a statistic (no gradient)
        unless `entropy_grad` (an entropy bonus in the loss).
        Masked positions hold junk; mask them. Without `return_logits`, a batch with more than
        CHUNKED_HEAD_MIN_LOGITS logits goes through the memory-lean chunked path (`rollout.lm_head`): same
        numbers, no (B, R, V).
    `packed`: score the rows padding-free, several to a packed row (`rollout.packing`; same numbers). True
    packs whenever the model supports it, None (default) also needs packing to save >= 10% of the tokens,
    False never packs.
    Unsupported models keep the padded batch (reason logged once).
    """
    length_r = responses.shape[1]
    if is_encoder_decoder(model):
        logits, values = _encoder_decoder_logits(model, query_ids, query_mask, responses, response_mask)
    else:
        input_ids = torch.cat([query_ids, responses], dim=1)
        attention_mask = torch.cat([query_mask.long(), response_mask.long()], dim=1)
        position_ids = position_ids_from_mask(attention_mask)
        rows = maybe_pack(model, input_ids, attention_mask, position_ids, length_r, packed)
        if not return_logits and prefers_chunked_head(model, responses.numel()):
            # no (B, R, V) logits: project the vocabulary tile by tile from the final hidden states
            options = dict(temperature=temperature, with_values=with_values, with_entropy=with_entropy)
            chunked = (
                chunked_response_outputs(model, input_ids, attention_mask, position_ids, responses, **options)
                if rows is None
                else packed_chunked_outputs(model, rows, responses, **options)
            )
            if chunked is not None:  # None: a head the chunked path does not handle (reason logged once)
                logprobs, values, entropy = chunked
                if entropy is not None and not entropy_grad:
                    entropy = entropy.detach()
                return ForwardOutput(logprobs=logprobs, values=values, entropy=entropy)
        if rows is not None:
            logits, values = packed_logits_and_values(model, rows, with_values=with_values)
        else:
            logits, values = _padded_logits(
                model, input_ids, attention_mask, position_ids, length_r, with_values
            )
    if temperature != 1.0:
        logits = logits / temperature
    result = ForwardOutput(logprobs=selective_log_softmax(logits, responses))
    if with_values:
        if values is None:
            raise ValueError(
                "with_values=True needs a model with a value head (e.g. AutoModelForCausalLMWithValueHead)"
            )
        result.values = values.float()
    if with_entropy:  # a statistic, unless asked for: no graph through the vocabulary softmax
        with torch.no_grad() if not entropy_grad else contextlib.nullcontext():
            result.entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    if return_logits:
        result.logits = logits
    return result


def _pad_columns(x: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """Right-pad dim 1 of (B, T, ...) with zeros up to `length` (None passes through)."""
    if x is None or x.shape[1] == length:
        return x
    return torch.cat([x, x.new_zeros((x.shape[0], length - x.shape[1], *x.shape[2:]))], dim=1)


@torch.no_grad()
def forward_batch(
    model: torch.nn.Module,
    batch: RolloutBatch,
    chunk_size: int,
    *,
    temperature: float = 1.0,
    with_values: bool = False,
    return_logits: bool = False,
) -> ForwardOutput:
    """`forward_response` over a whole `RolloutBatch`, `chunk_size` rows at a time (memory bound), no
    gradient.

    Each chunk is trimmed to the columns its rows use. Returns (B, R) logprobs and values over the batch's
    response columns, zero wherever `loss_mask` is 0, and (B, R, V) logits when asked.
    """
    length = batch.responses.shape[1]
    parts = [
        forward_response(
            model,
            rows.query_ids,
            rows.query_mask,
            rows.responses,
            rows.response_mask,
            temperature=temperature,
            with_values=with_values,
            return_logits=return_logits,
        )
        for _, rows in batch.minibatches(chunk_size)
    ]

    def joined(name: str) -> torch.Tensor | None:
        pieces = [getattr(p, name) for p in parts]
        return None if pieces[0] is None else torch.cat([_pad_columns(x, length) for x in pieces])

    mask = batch.loss_mask
    values = joined("values")
    return ForwardOutput(
        logprobs=joined("logprobs") * mask,
        values=None if values is None else values * mask,
        logits=joined("logits"),
    )


@with_onednn_linears
def last_token_scores(
    backbone: torch.nn.Module, head: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """(B, k) float32: `head` on the backbone's final hidden state at each row's last real token.

    How every reward model and reward adapter is read, as sequence classifiers do. Positions follow the
    mask, so left padding, right padding and pad == eos all give the same score.
    """
    if input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} "
            "differ in shape"
        )
    last = last_true_indices(attention_mask)
    if (last < 0).any():
        raise ValueError(
            "attention_mask has a row with no real token; every row needs at least one real token (1)"
        )
    hidden = backbone(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).last_hidden_state
    pooled = hidden[torch.arange(input_ids.shape[0], device=input_ids.device), last]
    return head(pooled.to(head.weight.dtype)).float()


@torch.no_grad()
def reward_model_scores(
    reward_model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """(B,) float32 score of a sequence-classification reward model, read at the last real token."""
    model = without_peft(reward_model)
    head = getattr(model, "score", None)
    backbone = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if head is not None and backbone is not None:
        logits = last_token_scores(backbone, head, input_ids, attention_mask)
    else:  # heads we do not know: rely on the model's own pooling
        if input_ids.shape != attention_mask.shape:
            raise ValueError(
                f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} "
                "differ in shape"
            )
        logits = reward_model(input_ids=input_ids, attention_mask=attention_mask).logits
    if logits.dim() == 2 and logits.shape[-1] != 1:
        raise ValueError(
            f"reward model must output one score per sequence (num_labels=1), got {logits.shape[-1]}"
        )
    return logits.reshape(-1).float()
