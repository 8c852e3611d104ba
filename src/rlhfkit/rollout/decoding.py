"""rlhfkit's own decode loop: `DecodeLoopBackend`, the default sampler of every trainer.

transformers `generate` spends most of a small model's sampling time outside the model: at a 152k
vocabulary `torch.multinomial` is ~70% of a CPU step, rows that already ended keep being computed until
every row ends, and each token pays for processor lists, stopping criteria and kwargs bookkeeping. This
loop samples from the same distribution (the processors transformers would apply, in its order, over the
model's generation_config defaults), by inverse-CDF (one uniform per row from torch's RNG, so seeds and
resumed RNG states keep working), and drops ended rows from the batch and the KV cache.

Settings it does not handle (beams, other generation options, encoder-decoder models, PEFT prompt
learning, models whose cache is not a plain attention KV cache) go to the transformers path, with the
reason logged once.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import torch
from transformers import GenerationConfig

from rlhfkit.models.cache_naming import cache_keyword
from rlhfkit.rollout.generation import HFGenerationBackend, is_encoder_decoder
from rlhfkit.rollout.kv_cache import decode_cache
from rlhfkit.rollout.streaming import generating_module

logger = logging.getLogger(__name__)

# GenerationConfig fields the loop reads, and fields that do not change what is sampled
_HANDLED = {
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "min_length",
    "min_new_tokens",
    "max_new_tokens",
    "eos_token_id",
    "pad_token_id",
}
_IGNORED = {"max_length", "bos_token_id", "decoder_start_token_id", "transformers_version", "use_cache"}
_logged_reasons: set[str] = set()


class NonFiniteLogitsError(RuntimeError):
    """The policy's next-token logits hold a NaN or an infinity: there is nothing meaningful to sample."""


def _non_finite_logits(step: int) -> NonFiniteLogitsError:
    return NonFiniteLogitsError(
        f"the policy produced non-finite logits (NaN or inf) at decoding step {step} (0: the first new "
        "token): its weights or activations are not finite, e.g. after a diverged update (lower the "
        "learning rate, set max_grad_norm) or from a corrupt or foreign checkpoint"
    )


def _log_fallback_once(reason: str) -> None:
    if reason not in _logged_reasons:
        _logged_reasons.add(reason)
        logger.warning("rlhfkit decode loop: %s; sampling with transformers generate instead", reason)


@dataclass(frozen=True)
class DecodeSettings:
    """The effective sampling settings of one call: ours over the model's generation_config over defaults."""

    max_new_tokens: int
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    min_p: float | None
    repetition_penalty: float
    min_length: int
    min_new_tokens: int
    eos_token_ids: tuple[int, ...]

    @classmethod
    def resolve(cls, model: torch.nn.Module, config: GenerationConfig) -> DecodeSettings | str:
        """The settings transformers `generate` would use for `config`, or why the loop cannot follow it."""
        if is_encoder_decoder(model):
            return "encoder-decoder models are not supported"
        peft = next((m for m in model.modules() if hasattr(m, "active_peft_config")), None)
        if peft is not None and getattr(peft.active_peft_config, "is_prompt_learning", False):
            return "PEFT prompt-learning adapters are not supported"
        generator = generating_module(model)
        layer_types = set(getattr(generator.config, "layer_types", None) or ())
        if not generator._supports_default_dynamic_cache() or layer_types - {
            "full_attention",
            "sliding_attention",
        }:
            return f"{type(generator).__name__}'s cache is not a plain attention KV cache"
        merged, _ = generator._prepare_generation_config(config)
        baseline = GenerationConfig()
        baseline.update(**generator.generation_config._get_default_generation_params(), defaults_only=True)
        base = baseline.to_dict()
        for key, value in merged.to_dict().items():
            off = value in (None, False) and base.get(key) in (
                None,
                False,
            )  # a model config's output_attentions=False
            if (
                not key.startswith("_")
                and key not in _HANDLED | _IGNORED
                and value != base.get(key)
                and not off
            ):
                return f"generation setting {key}={value!r} is not supported"
        eos = merged.eos_token_id
        eos = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
        return cls(
            max_new_tokens=merged.max_new_tokens,
            do_sample=bool(merged.do_sample),
            temperature=float(merged.temperature),
            top_k=int(merged.top_k or 0),
            top_p=float(merged.top_p),
            min_p=merged.min_p,
            repetition_penalty=float(merged.repetition_penalty),
            min_length=int(merged.min_length or 0),
            min_new_tokens=int(merged.min_new_tokens or 0),
            eos_token_ids=eos,
        )


def process_logits(scores: torch.Tensor, settings: DecodeSettings, seen: torch.Tensor | None, blocked=None):
    """What transformers' processors make of float32 logits (A, V), in transformers' order.

    seen: (A, V) bool, the tokens of each row so far (prompt padding excluded), for the repetition
    penalty; blocked: the stop token ids (a long tensor) while min_length / min_new_tokens is not reached
    yet, else None. Warpers apply only when sampling.
    """
    s = settings
    if seen is not None and s.repetition_penalty != 1.0:
        penalised = torch.where(scores < 0, scores * s.repetition_penalty, scores / s.repetition_penalty)
        scores = torch.where(seen, penalised, scores)
    if blocked is not None and blocked.numel():
        scores = scores.index_fill(-1, blocked, float("-inf"))
    if not s.do_sample:
        return scores
    if s.temperature != 1.0:
        scores = scores / s.temperature
    if s.top_k:
        kth = torch.topk(scores, min(s.top_k, scores.shape[-1]))[0][..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if s.top_p < 1.0:
        ascending, order = torch.sort(scores, descending=False)
        drop = ascending.softmax(-1).cumsum(-1) <= 1 - s.top_p
        drop[..., -1:] = False  # the most likely token always stays
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    if s.min_p is not None:
        probs = scores.softmax(-1)
        drop = probs < s.min_p * probs.amax(-1, keepdim=True)
        drop.scatter_(-1, probs.argmax(-1, keepdim=True), False)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


SAMPLER_BLOCK = 1024  # vocabulary columns per block of the two-level search


def sample_tokens(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of `probs` (A, V): the two-level inverse CDF on CPU, `torch.multinomial` elsewhere.

    Both are exact. On CPU the inverse CDF is ~130x cheaper at a 152k vocabulary; on a GPU its dozen small
    kernels cost more than multinomial's one pass (0.89 against 0.23 ms for 64 rows on an H100,
    benchmarks/sampler_device.json).
    """
    if probs.device.type == "cpu":
        return sample_inverse_cdf(probs)
    return torch.multinomial(probs, 1).squeeze(-1)


def sample_inverse_cdf(probs: torch.Tensor, block: int = SAMPLER_BLOCK) -> torch.Tensor:
    """One token per row of `probs` (A, V), drawn with probability proportional to its entry.

    Inverse-CDF sampling in two levels, so the draw is as exact as `torch.multinomial` at any vocabulary:
    a uniform draw in float64 picks a block of `block` columns by the running sum of the block totals,
    then a token inside that block by the block's own running sum, both in float64. One float32 running
    sum over a whole 152k-token row would not do: each token's share of it is rounded to the sum's last
    bit (6e-8 near 1), a total-variation error of 0.1% on a flat row, and tokens below that are drawn at
    a rate that has nothing to do with their probability. The only float32 rounding left is each block's
    total (relative 1e-7). Zero-probability tokens are never drawn: a draw rounded up to a total takes the
    last token where the running sum reaches it. One float64 uniform per row from torch's RNG, so seeds and
    resumed RNG states keep working; no host sync. Much cheaper than `multinomial` on CPU
    (benchmarks/decode_loop.json times both).
    """
    rows, vocab = probs.shape
    whole = vocab - vocab % block
    totals = probs[:, :whole].reshape(rows, -1, block).sum(-1)
    if whole < vocab:
        totals = torch.cat([totals, probs[:, whole:].sum(-1, keepdim=True)], dim=1)
    totals = totals.double()
    running = totals.cumsum(-1)
    target = torch.rand((rows, 1), device=probs.device, dtype=torch.float64) * running[:, -1:]
    chosen, before = _first_above(running, target)
    share = (target - before) / totals.gather(1, chosen)  # where the draw falls inside the block, in [0, 1)
    columns = chosen * block + torch.arange(block, device=probs.device)
    inside = probs.gather(1, columns.clamp(max=vocab - 1)).double().masked_fill(columns >= vocab, 0.0)
    inside = inside.cumsum(-1)
    token, _ = _first_above(inside, share * inside[:, -1:])
    return (chosen * block + token).squeeze(-1)


def _first_above(running: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index, running sum before it) of the first entry whose running sum exceeds `target`, per row.

    A target rounded up to the row's total would pass every positive entry into the zero ones after them:
    the index where the running sum first reaches the total, the last positive entry, bounds the search.
    """
    total = running[:, -1:].contiguous()
    index = torch.minimum(torch.searchsorted(running, target, right=True), torch.searchsorted(running, total))
    before = torch.where(index > 0, running.gather(1, (index - 1).clamp(min=0)), torch.zeros_like(target))
    return index, before


class DecodeLoopBackend(HFGenerationBackend):
    """`HFGenerationBackend` with rlhfkit's decode loop in place of `generate` (same outputs and shapes).

    The KV cache is transformers' `DynamicCache` with its attention layers preallocated for the whole
    rollout (`kv_cache.decode_cache`: no per-token `torch.cat`), cut to the live rows with
    `batch_select_indices` (transformers' `StaticCache` cannot drop rows).
    """

    def _generate_chunk(self, ids, mask, config, logprob_temperature, hidden) -> tuple:
        settings = DecodeSettings.resolve(self.model, config)
        if isinstance(settings, str):
            _log_fallback_once(settings)
            return super()._generate_chunk(ids, mask, config, logprob_temperature, hidden)
        first = int(mask.any(0).long().argmax())  # columns before it are padding in every row of the chunk
        loop = _DecodeLoop(
            self.model, settings, self.pad_token_id, logprob_temperature, self.value_head, hidden
        )
        return loop.run(ids[:, first:], mask[:, first:])


class _DecodeLoop:
    """One chunk's decoding: prefill, then one token per step for the rows that have not ended."""

    def __init__(
        self, model, settings: DecodeSettings, pad_token_id, logprob_temperature, value_head, hidden
    ):
        self.generator, self.settings, self.pad = generating_module(model), settings, pad_token_id
        self.logprob_temperature, self.value_head, self.hidden = logprob_temperature, value_head, hidden
        accepts = inspect.signature(self.generator.forward).parameters
        self.forward_kwargs = {"logits_to_keep": 1} if "logits_to_keep" in accepts else {}
        self.cache_argument = cache_keyword(self.generator)
        self.first_bad: torch.Tensor | None = None  # off CPU: the first step with non-finite logits, or -1

    def _forward(self, attention_mask, cache, **inputs) -> torch.Tensor:
        """Float32 next-token logits (A, V) of the last position.

        No mask: causal attention over every position."""
        inputs[self.cache_argument] = cache
        if attention_mask is not None:
            inputs["attention_mask"] = attention_mask
        out = self.generator(**inputs, use_cache=True, return_dict=True, **self.forward_kwargs)
        return out.logits[:, -1].float()

    def _prefill(self, ids, mask, positions, cache) -> torch.Tensor:
        """The prompts' forward. A prompt repeated in several rows (GRPO's and RLOO's groups) is computed once
        and its cache copied to each row (not with a value head, whose hidden states are per row)."""
        if self.value_head is None and ids.shape[0] > 1:
            key = ids if mask is None else torch.cat([ids, mask.to(ids.dtype)], dim=1)
            unique, inverse = torch.unique(key, dim=0, return_inverse=True)
            if unique.shape[0] < ids.shape[0]:
                rows = torch.arange(ids.shape[0], device=ids.device)
                first = rows.new_empty(unique.shape[0]).scatter_(0, inverse, rows)  # any row of each prompt
                mask = None if mask is None else mask[first]
                raw = self._forward(
                    input_ids=ids[first], attention_mask=mask, position_ids=positions[first], cache=cache
                )
                cache.batch_select_indices(inverse)
                return raw[inverse]
        return self._forward(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache)

    def _seen_tokens(self, ids, mask, vocab: int) -> torch.Tensor | None:
        if self.settings.repetition_penalty == 1.0:
            return None
        seen = torch.zeros((ids.shape[0], vocab + 1), dtype=torch.bool, device=ids.device)
        seen.scatter_(
            1, ids.clamp(max=vocab).masked_fill(mask == 0, vocab), True
        )  # padding -> the spare column
        return seen[:, :vocab]

    def _choose(
        self, raw: torch.Tensor, seen, step: int, prompt_width: int, stops: torch.Tensor
    ) -> torch.Tensor:
        s = self.settings
        blocked = step < s.min_new_tokens or prompt_width + step < s.min_length
        scores = process_logits(self._finite(raw, step), s, seen, stops if blocked else None)
        return sample_tokens(scores.softmax(-1)) if s.do_sample else scores.argmax(-1)

    def _finite(self, raw: torch.Tensor, step: int) -> torch.Tensor:
        """`raw`, checked: a row whose largest logit is not finite (a NaN or +inf in it, or no finite logit)
        raises NonFiniteLogitsError. On CPU at once; elsewhere without a host sync: the first bad step is
        kept on the device (`_raise_if_non_finite` reads it where the loop syncs anyway) and the row is
        made flat meanwhile, so `multinomial` never sees a NaN."""
        finite = torch.isfinite(raw.amax(-1))
        if self.first_bad is None:
            if not bool(finite.all()):
                raise _non_finite_logits(step)
            return raw
        self.first_bad = torch.where(finite.all() | (self.first_bad >= 0), self.first_bad, step)
        return torch.where(finite[:, None], raw, 0.0)

    def _raise_if_non_finite(self) -> None:
        if self.first_bad is not None and int(self.first_bad) >= 0:
            raise _non_finite_logits(int(self.first_bad))

    def run(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple:
        batch, width, steps = ids.shape[0], ids.shape[1], self.settings.max_new_tokens
        device = ids.device
        tokens = torch.full((batch, steps), self.pad, dtype=torch.long, device=device)
        logprobs = (
            torch.zeros((batch, steps), device=device) if self.logprob_temperature is not None else None
        )
        values = torch.zeros((batch, steps), device=device) if self.value_head is not None else None
        # no padding at all: no mask, so the model builds none per step (a causal mask is the same attention)
        full_mask = None if bool(mask.all()) else torch.cat([mask, mask.new_ones((batch, steps))], dim=1)
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        next_position = positions[:, -1:] + 1
        rows = torch.arange(batch, device=device)  # the output row of each live row
        stops = torch.tensor(self.settings.eos_token_ids, dtype=torch.long, device=device)
        ended = torch.zeros(batch, dtype=torch.bool, device=device)
        check_every = 1 if device.type == "cpu" else 8  # a host sync per check: cheap on CPU only
        self.first_bad = None if device.type == "cpu" else torch.full((), -1, device=device)
        cache = decode_cache(self.generator.config, capacity=width + steps)
        raw = self._prefill(ids, None if full_mask is None else mask, positions, cache)
        seen = self._seen_tokens(ids, mask, raw.shape[-1])
        done = 0
        for step in range(steps):
            token = self._choose(raw, seen, step, width, stops).masked_fill(ended, self.pad)
            self._record(tokens, logprobs, values, rows, step, raw, token)
            done = step + 1
            if stops.numel():
                ended = ended | torch.isin(token, stops)
            if step + 1 == steps:
                break
            if seen is not None:
                seen = seen.scatter(1, token[:, None], True)
            if stops.numel() and (step + 1) % check_every == 0:
                self._raise_if_non_finite()
                live = (~ended).nonzero().squeeze(1)
                if live.numel() == 0:
                    break
                if live.numel() < ended.numel():  # cut the ended rows out of every per-row state
                    cache.batch_select_indices(live)
                    rows, token, ended, next_position = (t[live] for t in (rows, token, ended, next_position))
                    full_mask = full_mask[live] if full_mask is not None else None
                    seen = seen[live] if seen is not None else None
            raw = self._forward(
                input_ids=token[:, None],
                position_ids=next_position,
                cache=cache,
                attention_mask=None if full_mask is None else full_mask[:, : width + step + 1],
            )
            next_position = next_position + 1
        self._raise_if_non_finite()
        keep = slice(0, done)
        return (
            tokens[:, keep],
            None if logprobs is None else logprobs[:, keep],
            None if values is None else values[:, keep],
        )

    def _record(
        self, tokens, logprobs, values, rows, step: int, raw: torch.Tensor, token: torch.Tensor
    ) -> None:
        """Write this step's tokens, their logprobs under raw logits / temperature, and values, by
        output row."""
        tokens[rows, step] = token
        if logprobs is not None:
            scaled = raw / self.logprob_temperature
            logprobs[rows, step] = scaled.gather(-1, token[:, None]).squeeze(-1) - scaled.logsumexp(-1)
        if values is not None:  # the LM-head input of this forward: the hidden state before the token
            state = self.hidden.pop()[:, -1]
            values[rows, step] = self.value_head(state).float().reshape(-1)
        self.hidden.clear()
