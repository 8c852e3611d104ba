"""`OfflineTrainer`: how the trainers that learn from a fixed dataset (reward, SFT, DPO) set themselves up.

"Offline" as opposed to the online RL trainers, which sample their own data (`online_loop`).
`OfflineTrainer.__init__` runs the same spine for each of them: `resolve_args` (config, keyword
overrides, tokenizer), the trainer's `_setup` (for all: `load_policy`, a path is loaded, then wrapped with
PEFT), `prepare_splits` (train and eval data), then `Trainer.__init__`; only what is particular to the
algorithm stays in the trainer's hooks.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import Trainer, set_seed

from rlhfkit.models.peft_detection import is_peft_model
from rlhfkit.trainers.common.guards import RobustTrainerMixin
from rlhfkit.trainers.common.moe import attach_router_aux_loss

logger = logging.getLogger(__name__)


def apply_overrides(args: Any, owner: str, **overrides: Any) -> Any:
    """Return a copy of `args` with every non-None keyword set on it.

    The seed API lets trainer keywords (max_length=..., beta=...) override the config; the caller's
    config object is left untouched, and the config re-validates itself after the change.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    if not given:
        return args
    args = copy.copy(args)
    for name, value in given.items():
        if not hasattr(args, name):
            raise TypeError(f"{owner}: {type(args).__name__} has no field {name!r}")
        if getattr(args, name) != value:
            logger.info(
                "%s: keyword %s=%r overrides the config value %r", owner, name, value, getattr(args, name)
            )
        setattr(args, name, value)
    validate = getattr(args, "validate", None)
    if callable(validate):
        validate()
    return args


def resolve_args(
    owner: str,
    config_cls: type,
    default_output_dir: str,
    args: Any,
    model: Any,
    model_init: Any,
    processing_class: Any,
    tokenizer: Any,
    /,
    **overrides: Any,
) -> tuple[Any, Any]:
    """(config, tokenizer) of a trainer: `args` upgraded to `config_cls`, the non-None keyword `overrides`
    applied; a model given as a path brings its own tokenizer when none was passed.
    """
    processing_class = processing_class_or_tokenizer(processing_class, tokenizer, owner)
    args = apply_overrides(as_config(args, config_cls, owner, default_output_dir), owner, **overrides)
    if model is None and model_init is None:
        raise ValueError(f"{owner}: pass `model` (a model or a local path) or `model_init`")
    # the model's folder may ship its tokenizer's code too: trusted as far as the model's is
    kwargs = args.from_pretrained_kwargs() if hasattr(args, "from_pretrained_kwargs") else {}
    trust = bool(kwargs.get("trust_remote_code", False))
    if isinstance(model, str) and processing_class is None:
        from transformers import AutoTokenizer

        processing_class = AutoTokenizer.from_pretrained(model, trust_remote_code=trust)
    elif processing_class is None and model is not None:  # a model loaded from a local folder: its tokenizer
        from rlhfkit.rewards.reward_models import folder_tokenizer

        path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
        processing_class = folder_tokenizer(path, trust) if path and Path(path).is_dir() else None
    return args, processing_class


def load_policy(
    model: Any,
    auto_class: type,
    init_kwargs: dict | None,
    peft_config: Any,
    owner: str,
    seed: int | None = None,
) -> nn.Module | None:
    """The trained model: loaded when given as a path, then wrapped with `peft_config` (None: model_init).

    Both can create weights (a new score head, LoRA's A matrices), so `seed` (the config's) is set first, as
    HF Trainer does before `model_init`: the run then does not depend on what drew random numbers before.
    """
    if seed is not None and (isinstance(model, str) or peft_config is not None):
        set_seed(seed)
    model = load_model(model, auto_class, init_kwargs, owner)
    return None if model is None else wrap_peft(model, peft_config, owner)


def processing_class_or_tokenizer(processing_class: Any, tokenizer: Any, owner: str) -> Any:
    """TRL 0.x passes the tokenizer as `tokenizer=`, transformers 5 as `processing_class=`; take either."""
    if tokenizer is None:
        return processing_class
    if processing_class is not None and processing_class is not tokenizer:
        raise ValueError(
            f"{owner}: `tokenizer` and `processing_class` are two names for one argument, and two different "
            "objects were given; pass only one of them"
        )
    return tokenizer


def load_model(model: Any, auto_class: type, init_kwargs: dict | None, owner: str) -> nn.Module:
    """A model object passes through; a string is a local folder (or cached name) loaded with `auto_class`,
    in float32 unless `init_kwargs` names a `dtype` (or the older `torch_dtype`), as TRL's trainers do: a
    bfloat16 checkpoint trained in bfloat16 would round tiny updates away."""
    if isinstance(model, str):
        looks_like_path = model.startswith((".", "~", "/")) or "\\" in model or model.count("/") > 1
        if looks_like_path and not Path(model).expanduser().exists():
            from rlhfkit.data.loading import MODEL_HINT, offline_error

            raise offline_error(f"{owner}: model", model, f"{MODEL_HINT}, or a loaded model")
        kwargs = dict(init_kwargs or {})
        kwargs.setdefault("trust_remote_code", False)
        if "dtype" not in kwargs and "torch_dtype" not in kwargs:
            kwargs["dtype"] = torch.float32
        return auto_class.from_pretrained(model, **kwargs)
    if model is None:
        return None
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"{owner}: `model` must be a PreTrainedModel, an nn.Module or a path string, got {type(model)}"
        )
    return model


def wrap_peft(model: nn.Module, peft_config: Any, owner: str) -> nn.Module:
    """Wrap `model` with LoRA (or any PEFT method) when a `peft_config` is given."""
    if peft_config is None:
        return model
    from peft import PeftConfig, get_peft_model

    if isinstance(peft_config, dict):
        from peft import get_peft_config

        peft_config = get_peft_config(peft_config)
    if not isinstance(peft_config, PeftConfig):
        raise TypeError(
            f"{owner}: `peft_config` must be a peft.PeftConfig (or its dict), got {type(peft_config)}"
        )
    if is_peft_model(model):
        raise ValueError(
            f"{owner}: the model is already a PeftModel; pass peft_config=None or a plain base model"
        )
    return get_peft_model(model, peft_config)


# The library tag of every trained model. TRL tags its models "trl"; a model trained by rlhfkit says so
# instead: the tag is provenance metadata pushed to the Hub with the model (docs/migrating_from_trl.md).
LIBRARY_TAG = "rlhfkit"


def tag_model(model: nn.Module | None, trainer_tag: str) -> None:
    """Add rlhfkit's tag and the trainer's (TRL 1.x's trainer tags: "sft", "dpo", "grpo", ...) to
    `model.model_tags`, which `push_to_hub` writes into the model card; a model without them is left alone."""
    add = getattr(model, "add_model_tags", None)
    if callable(add):
        add([LIBRARY_TAG, trainer_tag])


def set_special_tokens(
    tokenizer: Any, owner: str, pad_token: str | None = None, eos_token: str | None = None
) -> None:
    """A config's own pad/eos token (each checked against the vocabulary) onto the tokenizer; a tokenizer
    left without a pad token then pads with its eos token, as TRL does."""
    if tokenizer is None:
        return
    for name, token in (("eos_token", eos_token), ("pad_token", pad_token)):
        if token is not None:
            if tokenizer.convert_tokens_to_ids(token) in (None, tokenizer.unk_token_id):
                raise ValueError(f"{owner}: {name}={token!r} is not in the tokenizer's vocabulary")
            setattr(tokenizer, name, token)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token


def disable_dropout(model: nn.Module | None) -> None:
    """Dropout makes the chosen/rejected log-probabilities noisy; preference losses prefer it off."""
    if model is None:
        return
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


def as_config(args: Any, config_cls: type, owner: str, default_output_dir: str) -> Any:
    """Accept None, the trainer's own config, or plain TrainingArguments (upgraded to `config_cls`)."""
    import dataclasses

    from transformers import TrainingArguments

    if args is None:
        return config_cls(output_dir=default_output_dir, report_to="none")
    if isinstance(args, config_cls):
        return args
    if isinstance(args, TrainingArguments):
        # A field the trainer's config gives another default (remove_unused_columns=False: the pair
        # columns are not forward() arguments) keeps that default unless the caller changed it from
        # the TrainingArguments default. The caller's object is only read.
        own_defaults = {f.name: f.default for f in dataclasses.fields(config_cls) if f.init}
        values = {}
        for f in dataclasses.fields(TrainingArguments):
            if not f.init or not hasattr(args, f.name):
                continue
            value = getattr(args, f.name)
            if own_defaults.get(f.name, f.default) != f.default and value == f.default:
                continue
            values[f.name] = copy.deepcopy(value)
        return config_cls(**values)
    raise TypeError(
        f"{owner}: `args` must be a {config_cls.__name__} or TrainingArguments, got {type(args).__name__}"
    )


class MetricBuffer:
    """Per-step metrics gathered in compute_loss, averaged and emitted by the trainer's next `log` call."""

    def __init__(self) -> None:
        self._store: dict[str, dict[str, list[float]]] = {"train": {}, "eval": {}}

    def add(self, split: str, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._store[split].setdefault(key, []).append(float(value))

    def pop_means(self, split: str, prefix: str = "", accelerator: Any = None) -> dict[str, float]:
        """Means since the last call; with several processes, averaged over all of them (every rank logs)."""
        means = {f"{prefix}{k}": sum(v) / len(v) for k, v in sorted(self._store[split].items()) if v}
        self._store[split] = {}
        if means and accelerator is not None and accelerator.num_processes > 1:
            import torch

            local = torch.tensor(list(means.values()), dtype=torch.float64, device=accelerator.device)
            means = dict(zip(means, accelerator.reduce(local, reduction="mean").tolist()))
        return means


def prepare_splits(train_dataset: Any, eval_dataset: Any, prepare: Any) -> tuple[Any, Any]:
    """Apply `prepare(dataset, arg_name)` to the train set and to one or a dict of eval sets."""
    train = prepare(train_dataset, "train_dataset")
    if isinstance(eval_dataset, dict):
        return train, {k: prepare(v, f"eval_dataset[{k!r}]") for k, v in eval_dataset.items()}
    return train, prepare(eval_dataset, "eval_dataset")


class OfflineTrainer(RobustTrainerMixin, Trainer):
    """Base of the offline trainers; TRL 0.x's keyword arguments override the matching `args` fields.

    A subclass names its config (`config_class`, `default_output_dir`), the config fields that may be given
    as keywords (`override_keywords`), and fills `_setup` (model and trainer state, before the data),
    `_prepare` (one dataset) and `_default_collator`. TRL 0.x's `tokenizer=` is another name for
    `processing_class=`.
    """

    config_class: ClassVar[type]
    default_output_dir: ClassVar[str]
    model_tag: ClassVar[str]  # TRL 1.x's tag of the trainer (`tag_model`)
    override_keywords: ClassVar[tuple[str, ...]] = ()
    default_compute_metrics: ClassVar[Callable | None] = None

    def __init__(
        self,
        model: nn.Module | str | None = None,
        args: Any = None,
        data_collator: Callable | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        model_init: Callable | None = None,
        compute_metrics: Callable | None = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        preprocess_logits_for_metrics: Callable | None = None,
        peft_config: Any = None,
        *,
        tokenizer: Any = None,
        **overrides: Any,
    ):
        owner = type(self).__name__
        unknown = sorted(set(overrides) - set(self.override_keywords))
        if unknown:
            raise TypeError(f"{owner}.__init__() got unexpected keyword arguments {unknown}")
        plain_args = args is not None and not isinstance(args, self.config_class)
        legacy_form = tokenizer is not None or plain_args or any(v is not None for v in overrides.values())
        if train_dataset is None and not legacy_form:
            # TRL 1.x requires a training set; TRL 0.x's form keeps transformers.Trainer's optional one
            raise ValueError(
                f"{owner}: `train_dataset` is required (the examples to train on); only TRL 0.x's call form "
                "(args a plain TrainingArguments, or tokenizer=) may leave it out, e.g. to evaluate only"
            )
        args, processing_class = resolve_args(
            owner,
            self.config_class,
            self.default_output_dir,
            args,
            model,
            model_init,
            processing_class,
            tokenizer,
            **overrides,
        )
        model, args = self._setup(model, args, processing_class, peft_config)
        self._given_collator = data_collator  # `_prepare` may keep a layout the caller's collator reads
        train_dataset, eval_dataset = prepare_splits(
            train_dataset, eval_dataset, lambda ds, arg: self._prepare(ds, processing_class, args, arg)
        )
        if data_collator is None:
            data_collator = self._default_collator(args, processing_class)
        super().__init__(
            model=model, args=args, data_collator=data_collator,
            train_dataset=train_dataset, eval_dataset=eval_dataset, processing_class=processing_class,
            model_init=model_init, compute_metrics=compute_metrics or self.default_compute_metrics,
            callbacks=callbacks, optimizers=optimizers,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        )  # fmt: skip
        # after Trainer.__init__: with `model_init`, self.model only exists now
        attach_router_aux_loss(self, getattr(self.args, "router_aux_loss_coef", 0.0), owner)
        tag_model(self.model, self.model_tag)

    def _setup(self, model: Any, args: Any, processing_class: Any, peft_config: Any) -> tuple[Any, Any]:
        """(model, args) after loading and wrapping the model; also sets the trainer's own state."""
        raise NotImplementedError

    def _prepare(self, dataset: Any, tokenizer: Any, args: Any, arg: str) -> Any:
        """`dataset` (the argument named `arg`) in the form the collator expects."""
        raise NotImplementedError

    def _default_collator(self, args: Any, processing_class: Any) -> Callable:
        """The collator used when none is passed."""
        raise NotImplementedError

    def evaluate(self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"):
        """`Trainer.evaluate`; a raw dataset (or dict of them) passed here is prepared like `eval_dataset`.

        Trainer.evaluate calls itself once per entry of a dict; those calls get the prepared sets as they are.
        """
        if eval_dataset is not None and not isinstance(eval_dataset, str) and not self._evaluating_dict:
            _, eval_dataset = prepare_splits(
                None, eval_dataset, lambda ds, arg: ds if ds is None else self._prepare_raw(ds, arg)
            )
        nested, self._evaluating_dict = self._evaluating_dict, isinstance(eval_dataset, dict)
        try:
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        finally:
            self._evaluating_dict = nested

    _evaluating_dict = False

    def _prepare_raw(self, dataset: Any, arg: str) -> Any:
        """`_prepare` for a dataset given to `evaluate` (a prepared dataset comes back unchanged)."""
        return self._prepare(dataset, self.processing_class, self.args, arg)
