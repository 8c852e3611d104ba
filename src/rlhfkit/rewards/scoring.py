"""One way to score completions, for every trainer, command and the demo.

A reward source is one of:
- a callable `completions -> scores` on the decoded text (also given `prompts=` when it takes that
  keyword); a score may be None, "not applicable": that source is left out of the row's weighted sum (a row
  no source applies to scores NaN). A caller passing `function_kwargs` calls every function with exactly
  those keywords instead (GRPO: `prompts`, `completions`, `completion_ids` and the dataset's other columns),
  plus each of `function_extras` (GRPO: `trainer_state`, `log_extra`, `log_metric`) it names or takes
  through `**kwargs`;
- a sequence-classification reward model (one output), read at the last real token
  (`scoring.reward_model_scores`): on the policy's own token ids, or, when it has its own tokenizer
  (`reward_processing_class`), on prompt + completion text re-encoded with that tokenizer;
- a model carrying a reward adapter (a value-head policy loaded with `reward_adapter=...`): scored with
  its `sequence_reward_score`, i.e. the same reading with the frozen reward adapter switched on.
An `async def` reward function is awaited; the async functions of one batch run concurrently (TRL's async
reward functions: e.g. one that calls a remote verifier). Several sources are combined as a weighted sum
(`reward_weights`). A function's value must be a real number
(int, float, a numpy number, a one-element tensor) or None; anything else (a str such as "7", a bool, a list)
is a TypeError naming the function and the row. Non-finite scores are not an error here: they warn, naming
the source, and the trainers skip that update (the non-finite guard counts it; `Scores.applies` tells a
None from a NaN). A row every function returned None for warns too (as TRL does) and scores NaN.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import numbers
import warnings
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from rlhfkit.core.warnings import NonFiniteStepWarning
from rlhfkit.models.peft_detection import peft_model_of
from rlhfkit.rewards.reward_models import check_reward_vocab
from rlhfkit.rollout.generation import pad_right
from rlhfkit.rollout.scoring import reward_model_scores


def is_reward_adapter_model(source: Any) -> bool:
    """A model that scores with its own reward adapter (`sequence_reward_score`), not a separate network."""
    return isinstance(source, nn.Module) and callable(getattr(source, "sequence_reward_score", None))


def source_name(source: Any) -> str:
    if is_reward_adapter_model(source):
        return f"reward adapter {getattr(source, 'reward_adapter_name', None)!r}"
    if isinstance(source, nn.Module):
        return f"reward model {type(source).__name__}"
    name = getattr(source, "__name__", None) or type(source).__name__
    return f"reward function {name!r}"


def _accepts(fn: Callable, name: str) -> bool:
    """Whether `fn` takes the keyword `name` (by that name or through **kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind == inspect.Parameter.VAR_KEYWORD for p in params)


def await_all(awaitables: Sequence[Awaitable]) -> list[Any]:
    """The results of `awaitables`, run concurrently on one event loop; from inside a running loop (a
    notebook), on a worker thread's own loop."""

    async def gather() -> list[Any]:
        return list(await asyncio.gather(*awaitables))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, gather()).result()


def _warn_non_finite(source: Any, values: torch.Tensor) -> None:
    message = f"{source_name(source)} returned non-finite scores: {values.tolist()}"
    warnings.warn(message, NonFiniteStepWarning, stacklevel=3)


class Scores(tuple):
    """What a `RewardScorer` call returns: unpacks as `(scores (N,), per_source (S, N))`, and carries
    `applies` (S, N) bool, False where a function returned None ("does not apply")."""

    applies: torch.Tensor

    def __new__(cls, scores: torch.Tensor, per_source: torch.Tensor, applies: torch.Tensor) -> Scores:
        out = super().__new__(cls, (scores, per_source))
        out.applies = applies
        return out


def _as_real(value: Any, fn: Callable, row: int, completion: Any) -> float:
    """A reward function's value for one row as a float (NaN for None); TypeError unless it is a number."""
    if value is None:
        return float("nan")
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_complex:
        if value.dtype != torch.bool:
            return float(value.item())
    elif isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    context = "" if completion is None else f" (completion {str(completion)[:40]!r})"
    raise TypeError(
        f"{source_name(fn)} returned {type(value).__name__} {shown} for row {row}{context}; a reward must "
        "be a real number (int or float), or None where the function does not apply"
    )


class RewardScorer:
    """Weighted sum of reward sources; each call returns (scores (N,), per-source scores (S, N)).

    `reward_model`: one source or a list (see the module docstring). `tokenizer`: the policy's, used to
    decode completions for text sources. `reward_processing_class`: a reward model's own tokenizer (one
    per source for a list; None or the policy's tokenizer: the model reads the policy's token ids).
    `add_special_tokens`: whether re-encoded text gets the reward tokenizer's special tokens (BOS).
    """

    def __init__(
        self,
        reward_model: Any,
        tokenizer: Any,
        reward_processing_class: Any = None,
        reward_weights: Sequence[float] | None = None,
        device: torch.device | str = "cpu",
        add_special_tokens: bool = False,
    ):
        self.sources = list(reward_model) if isinstance(reward_model, (list, tuple)) else [reward_model]
        if not self.sources:
            raise ValueError("reward_model: give at least one reward model or reward function")
        for source in self.sources:
            if not (isinstance(source, nn.Module) or callable(source)):
                raise TypeError(
                    f"reward_model must be an nn.Module (sequence classification, one output), a model with "
                    f"a reward adapter, or a callable list[str] -> list[float], got {type(source).__name__}"
                )
            if is_reward_adapter_model(source) and getattr(source, "reward_adapter_name", None) is None:
                raise ValueError(
                    f"reward_model: this {type(source).__name__} has no reward adapter loaded; pass "
                    "reward_adapter= to from_pretrained"
                )
        self.weights = (
            [1.0] * len(self.sources) if reward_weights is None else [float(w) for w in reward_weights]
        )
        if len(self.weights) != len(self.sources):
            raise ValueError(
                f"reward_weights has {len(self.weights)} entries for {len(self.sources)} reward sources; "
                "give one weight per reward model / function"
            )
        tokenizers = reward_processing_class
        if not isinstance(tokenizers, (list, tuple)):
            tokenizers = [tokenizers] * len(self.sources)
        if len(tokenizers) != len(self.sources):
            raise ValueError(
                f"reward_processing_class: got {len(tokenizers)} tokenizers for {len(self.sources)} sources"
            )
        # None or the policy's own tokenizer: score the token ids directly, no decode / re-encode round trip
        self.tokenizers = [None if tok is None or tok is tokenizer else tok for tok in tokenizers]
        for tok in self.tokenizers:
            # no pad token, or one outside the vocabulary: pad with eos, as TRL does (the scores are read
            # through the attention mask, so the pad id itself never matters)
            if tok is not None and tok.pad_token_id is None:
                if tok.eos_token_id is None:
                    raise ValueError(
                        "reward_processing_class has no usable pad token and no eos token to pad with; set "
                        f"tokenizer.pad_token to a token of its vocabulary (got {tok.pad_token!r})"
                    )
                tok.pad_token = tok.eos_token
        self.tokenizer, self.device, self.add_special_tokens = tokenizer, device, add_special_tokens
        for source, own in zip(self.sources, self.tokenizers):  # models reading the policy's token ids
            if tokenizer is not None and own is None and isinstance(source, nn.Module):
                if not is_reward_adapter_model(source):
                    check_reward_vocab(source, tokenizer, source_name(source))
        for source in self.sources:
            if isinstance(source, nn.Module) and not is_reward_adapter_model(source):  # never freeze a policy
                source.to(device).eval().requires_grad_(False)

    @property
    def needs_text(self) -> bool:
        return any(
            not isinstance(s, nn.Module) or t is not None for s, t in zip(self.sources, self.tokenizers)
        )

    def __call__(
        self,
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        responses: torch.Tensor,
        response_mask: torch.Tensor,
        prompts: list[str] | None = None,
        completions: list[str] | None = None,
        function_kwargs: dict[str, Any] | None = None,
        function_extras: dict[str, Any] | None = None,
    ) -> Scores:
        """Score a padded batch: queries (N, Lq) left-padded, responses (N, R) right-padded.

        Per-source scores are NaN where a function returned None.
        """
        if self.needs_text and (prompts is None or completions is None):
            prompts = self._require_tokenizer().batch_decode(query_ids, skip_special_tokens=True)
            completions = [
                self.tokenizer.decode(r[m], skip_special_tokens=True)
                for r, m in zip(responses, response_mask.bool())
            ]

        def token_ids() -> tuple[torch.Tensor, torch.Tensor]:
            ids = torch.cat([query_ids, responses], dim=1)
            return ids, torch.cat([query_mask.long(), response_mask.long()], dim=1)

        n, device = responses.shape[0], responses.device
        return self._score(token_ids, prompts, completions, n, device, function_kwargs, function_extras)

    def score_responses(
        self,
        queries: Sequence[torch.Tensor],
        responses: Sequence[torch.Tensor],
        prompts: list[str] | None = None,
        completions: list[str] | None = None,
    ) -> Scores:
        """Score the unpadded 1-D query and response tensors of the classic PPO loop (`PPOTrainer.step`).

        Models read each query + response right-padded; `prompts`/`completions` default to the decoded ids.
        """
        if len(queries) != len(responses):
            raise ValueError(f"got {len(queries)} queries for {len(responses)} responses; expected one each")
        if self.needs_text and prompts is None:
            prompts = self._require_tokenizer().batch_decode(list(queries), skip_special_tokens=True)
        if self.needs_text and completions is None:
            completions = self._require_tokenizer().batch_decode(list(responses), skip_special_tokens=True)

        def token_ids() -> tuple[torch.Tensor, torch.Tensor]:
            pad_id = self._require_tokenizer().pad_token_id
            ids, mask = pad_right([torch.cat([q, r]) for q, r in zip(queries, responses)], pad_id)
            return ids.to(self.device), mask.long().to(self.device)

        return self._score(token_ids, prompts, completions, len(responses), torch.device(self.device))

    def score_texts(self, prompts: Sequence[str], completions: Sequence[str]) -> Scores:
        """Score prompt + completion strings (judges, evaluation); a model without its own tokenizer reads
        them encoded with the policy's."""
        if len(prompts) != len(completions):
            raise ValueError(
                f"got {len(prompts)} prompts for {len(completions)} completions; expected one each"
            )
        prompts, completions = list(prompts), list(completions)

        def token_ids() -> tuple[torch.Tensor, torch.Tensor]:
            return self._encode(self._require_tokenizer(), prompts, completions)

        return self._score(token_ids, prompts, completions, len(completions), torch.device(self.device))

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError("RewardScorer needs the policy's tokenizer to decode or pad completions")
        return self.tokenizer

    def _score(
        self,
        token_ids: Callable[[], tuple[torch.Tensor, torch.Tensor]],
        prompts: list[str] | None,
        completions: list[str] | None,
        n: int,
        device: torch.device,
        function_kwargs: dict[str, Any] | None = None,
        function_extras: dict[str, Any] | None = None,
    ) -> Scores:
        per_source = torch.empty(len(self.sources), n, device=device)
        applies = torch.ones(len(self.sources), n, dtype=torch.bool, device=device)
        called = {
            i: self._invoke(source, completions, prompts, function_kwargs, function_extras)
            for i, source in enumerate(self.sources)
            if not isinstance(source, nn.Module)
        }
        pending = [i for i, result in called.items() if inspect.isawaitable(result)]
        if pending:  # async reward functions, all at once
            called.update(zip(pending, await_all([called[i] for i in pending])))
        ids = None
        for i, (source, reward_tokenizer) in enumerate(zip(self.sources, self.tokenizers)):
            if not isinstance(source, nn.Module):
                values, applies[i] = self._function_scores(source, called[i], completions, n)
            elif reward_tokenizer is not None:
                values = self._score_retokenized(source, reward_tokenizer, prompts, completions)
            else:
                ids = token_ids() if ids is None else ids
                values = self._model_scores(source, *ids)
            if not torch.isfinite(values[applies[i].to(values.device)]).all():
                _warn_non_finite(source, values)
            per_source[i] = values.to(per_source)
        weights = torch.tensor(self.weights, device=per_source.device)
        weighted = weights[:, None] * per_source
        if bool(applies.all()):
            return Scores(weighted.sum(0), per_source, applies)
        unscored = ~applies.any(0)
        if bool(unscored.any()):
            rows = unscored.nonzero().flatten().tolist()
            shown = ", ".join(map(str, rows[:10])) + (", ..." if len(rows) > 10 else "")
            warnings.warn(
                f"every reward function returned None for {len(rows)} of {n} rows ({shown}): they get no "
                "reward. Make sure at least one reward function applies to each row",
                UserWarning,
                stacklevel=3,
            )
        scores = torch.where(applies, weighted, 0.0).sum(0)
        return Scores(scores.masked_fill(unscored, float("nan")), per_source, applies)

    @staticmethod
    def _model_scores(
        model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        if not is_reward_adapter_model(model):
            return reward_model_scores(model, input_ids, attention_mask)
        peft_model = peft_model_of(model)
        active = peft_model.active_adapter if peft_model is not None else "default"
        scores = model.sequence_reward_score(
            input_ids=input_ids, attention_mask=attention_mask, ppo_adapter_name=active
        )
        if scores.dim() != 1:
            raise ValueError(
                f"{source_name(model)} must output one score per sequence, got shape {tuple(scores.shape)}"
            )
        return scores

    @staticmethod
    def _invoke(
        fn: Callable,
        completions: list[str],
        prompts: list[str],
        kwargs: dict | None = None,
        extras: Any = None,
    ) -> Any:
        """What a reward function returns (an awaitable for an async one); each of `extras` only where the
        function takes it."""
        if kwargs is not None:
            return fn(**kwargs, **{k: v for k, v in (extras or {}).items() if _accepts(fn, k)})
        return fn(completions, prompts=prompts) if _accepts(fn, "prompts") else fn(completions)

    def _function_scores(
        self, fn: Callable, result: Any, completions: list[str], n: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(n,) float32 scores from a reward function's `result`, NaN where it returned None, and (n,) bool:
        not None."""
        if isinstance(result, torch.Tensor):
            result = result.detach().reshape(-1).tolist()
        elif isinstance(result, np.ndarray):
            result = result.reshape(-1).tolist()
        if isinstance(result, (str, bytes, dict)) or not hasattr(result, "__iter__"):
            raise ValueError(
                f"{source_name(fn)} must return a list of numbers (or None), got {type(result).__name__}"
            )
        result = list(result)
        if len(result) != n:
            raise ValueError(
                f"{source_name(fn)} returned {len(result)} scores for {n} completions; expected one each"
            )
        texts = completions if completions is not None and len(completions) == n else [None] * n
        values = [_as_real(v, fn, row, text) for row, (v, text) in enumerate(zip(result, texts))]
        applies = [v is not None for v in result]
        device = self.device
        return torch.tensor(values, dtype=torch.float32, device=device), torch.tensor(applies, device=device)

    def _score_retokenized(
        self, model: nn.Module, tokenizer: Any, prompts: list[str], completions: list[str]
    ) -> torch.Tensor:
        return self._model_scores(model, *self._encode(tokenizer, prompts, completions))

    def _encode(
        self, tokenizer: Any, prompts: list[str], completions: list[str]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        texts = [p + c for p, c in zip(prompts, completions)]
        batch = tokenizer(
            texts, return_tensors="pt", padding=True, add_special_tokens=self.add_special_tokens
        )
        return batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
