"""Language models with a scalar value head, for PPO's critic.

`AutoModelForCausalLMWithValueHead` / `AutoModelForSeq2SeqLMWithValueHead` wrap a transformers model (or a
`PeftModel` around one) and add `v_head`: dropout then a linear map from the last hidden state to one
value per token. The head computes in float32 whatever the base dtype, because values feed the GAE
recursion and the value loss, where bf16 rounding is visible.

On disk a wrapper is exactly what transformers/peft would save for the base (full weights, or only the
adapters for a PEFT model; safetensors, sharded when large) plus `value_head.safetensors`, so plain
`AutoModelForCausalLM.from_pretrained(folder)` still loads the base. Checkpoints that keep `v_head.*`
keys inside the model weights (TRL's layout) also load. The loading and the files themselves are in
`value_head_io`.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlhfkit.core.masking import last_true_indices
from rlhfkit.models import adapters, peft_detection, value_head_io
from rlhfkit.models.cache_naming import cache_keyword, returned_cache
from rlhfkit.models.value_head_io import ADAPTER_LAYOUT_FILE, VALUE_HEAD_FILE

__all__ = [
    "AutoModelForCausalLMWithValueHead",
    "AutoModelForSeq2SeqLMWithValueHead",
    "PreTrainedModelWrapper",
    "ValueHead",
    "V_HEAD_INIT_STRATEGIES",
    "output_head",
    "VALUE_HEAD_FILE",  # from value_head_io, importable here as before
    "ADAPTER_LAYOUT_FILE",
]

V_HEAD_INIT_STRATEGIES = (None, "normal")


class ValueHead(nn.Module):
    """hidden (B, T, H) -> values (B, T) float32: dropout, then `summary = Linear(H, 1)`."""

    def __init__(self, hidden_size: int, summary_dropout_prob: float = 0.1):
        super().__init__()
        self.dropout = nn.Dropout(summary_dropout_prob) if summary_dropout_prob else nn.Identity()
        self.summary = nn.Linear(hidden_size, 1, dtype=torch.float32)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self.summary.weight
        x = self.dropout(hidden_states.to(device=weight.device, dtype=torch.float32))
        return F.linear(x, weight.float(), self.summary.bias.float()).squeeze(-1)


def _hidden_size(config: Any) -> int:
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for attr in ("hidden_size", "d_model", "n_embd", "word_embed_proj_dim"):
        value = getattr(text_config, attr, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"cannot find the hidden size in {type(config).__name__}; expected `hidden_size`")


def output_head(model: nn.Module, namings: tuple[str, ...]) -> nn.Module | None:
    """The module mapping hidden states to vocabulary logits, or None for a bare encoder/decoder.

    Architectures name it differently (`lm_head`, GPT-NeoX's `embed_out`, FSMT's tied decoder embedding
    behind `get_output_embeddings()`), so transformers' own accessor is asked first, then the usual names
    as attributes, then any submodule whose last name component is one of them.
    """
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if isinstance(head, nn.Module):
        return head
    for name in namings:
        if isinstance(getattr(model, name, None), nn.Module):
            return getattr(model, name)
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in namings:
            return module
    return None


def _check_head_args(summary_dropout_prob: float, v_head_init_strategy: str | None) -> None:
    if not 0.0 <= summary_dropout_prob < 1.0:
        raise ValueError(f"summary_dropout_prob must be in [0, 1), got {summary_dropout_prob}")
    if v_head_init_strategy not in V_HEAD_INIT_STRATEGIES:
        raise ValueError(
            f"v_head_init_strategy must be one of {V_HEAD_INIT_STRATEGIES}, got {v_head_init_strategy!r}"
        )


class PreTrainedModelWrapper(nn.Module):
    """A transformers model (or PeftModel) plus a value head; shared by the causal and seq2seq wrappers."""

    transformers_parent_class: Any = None
    is_encoder_decoder = False
    lm_head_namings: tuple[str, ...] = ("lm_head", "embed_out")  # TRL's names of a language-model head

    def __init__(
        self,
        pretrained_model: nn.Module,
        summary_dropout_prob: float | None = None,
        v_head_init_strategy: str | None = None,
        v_head_initializer_range: float = 0.2,
    ):
        """`summary_dropout_prob`: the value head's dropout; None takes the model config's
        `summary_dropout_prob` when it has one, else 0.1 (TRL's rule)."""
        super().__init__()
        if not isinstance(pretrained_model, nn.Module) or not hasattr(pretrained_model, "config"):
            raise TypeError(
                "pretrained_model must be a transformers PreTrainedModel or PeftModel, "
                f"got {type(pretrained_model)}"
            )
        if output_head(pretrained_model, self.lm_head_namings) is None:
            raise ValueError(
                f"{type(pretrained_model).__name__} has no language-model head (get_output_embeddings() is "
                f"None and no module is named {' / '.join(self.lm_head_namings)}); load it with "
                f"{self.transformers_parent_class.__name__}"
            )
        if summary_dropout_prob is None:
            summary_dropout_prob = getattr(pretrained_model.config, "summary_dropout_prob", None)
            summary_dropout_prob = 0.1 if summary_dropout_prob is None else summary_dropout_prob
        _check_head_args(summary_dropout_prob, v_head_init_strategy)
        self.pretrained_model = pretrained_model
        self.v_head = ValueHead(_hidden_size(pretrained_model.config), summary_dropout_prob)
        if v_head_init_strategy == "normal":
            # small random weights and zero bias: initial values ~ 0 whatever the hidden-state scale
            nn.init.normal_(self.v_head.summary.weight, mean=0.0, std=v_head_initializer_range)
            nn.init.zeros_(self.v_head.summary.bias)
        # None: PyTorch's default Linear init (uniform in +-1/sqrt(H) for weight and bias)
        self.v_head.to(self._base_device())
        self.score: nn.Linear | None = None
        self.reward_adapter_name: str | None = None
        self._register_load_state_dict_pre_hook(self._flat_keys_to_nested)

    # ----------------------------------------------------------------- properties and passthroughs
    @property
    def is_peft_model(self) -> bool:
        return peft_detection.is_peft_model(self)

    @property
    def device(self) -> torch.device:
        return self._base_device()

    def _base_device(self) -> torch.device:
        param = next(self.pretrained_model.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_") or name == "pretrained_model":
                raise
            return getattr(super().__getattr__("pretrained_model"), name)  # config, generation_config, ...

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.pretrained_model.generate(*args, **kwargs)

    def gradient_checkpointing_enable(self, *args: Any, **kwargs: Any) -> None:
        self.pretrained_model.gradient_checkpointing_enable(*args, **kwargs)

    def gradient_checkpointing_disable(self) -> None:
        self.pretrained_model.gradient_checkpointing_disable()

    # ----------------------------------------------------------------- forward
    def _last_hidden_state(self, outputs: Any) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        return_past_key_values: bool = False,
        **kwargs: Any,
    ) -> tuple:
        """Returns `(lm_logits, loss, values)`; `values` is (B, T) float32 ((B, T_dec) for seq2seq).

        `loss` is the base model's LM loss when `labels` are given, else None. With
        `return_past_key_values=True` the KV cache is appended as a fourth element.
        """
        kwargs["output_hidden_states"] = True
        if past_key_values is not None:
            kwargs[cache_keyword(peft_detection.without_peft(self.pretrained_model))] = past_key_values
        outputs = self.pretrained_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        values = self.v_head(self._last_hidden_state(outputs))
        result = (outputs.logits, outputs.loss, values)
        return result + (returned_cache(outputs),) if return_past_key_values else result

    # ----------------------------------------------------------------- multi-adapter RL
    def load_reward_adapter(
        self, reward_adapter: str | os.PathLike, adapter_name: str = "reward_adapter"
    ) -> None:
        """Load a LoRA reward adapter and its score head, frozen, into this PEFT model (see `adapters`)."""
        if self.score is not None:
            raise ValueError(f"a reward adapter ({self.reward_adapter_name!r}) is already loaded")
        self.score = adapters.load_reward_adapter(self, reward_adapter, adapter_name)
        self.reward_adapter_name = adapter_name

    def compute_reward_score(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        ppo_adapter_name: str = "default",
        **kwargs: Any,
    ) -> torch.Tensor:
        """Per-token scores of the reward adapter: (B, T, num_labels), float32, as TRL returns them.

        Position t holds the reward head applied to the final hidden state of token t, so a sequence's
        score is the row at its last real token: `scores[:, -1]` for unpadded or left-padded input, and
        `sequence_reward_score` for any padding. No gradient; eval mode; afterwards `ppo_adapter_name` is
        the active adapter again, also when scoring raises.
        """
        if self.score is None or self.reward_adapter_name is None:
            raise ValueError("no reward adapter loaded: pass reward_adapter= to from_pretrained")
        kwargs.pop("token_type_ids", None)  # so `compute_reward_score(**tokenizer_output)` works
        if kwargs:
            raise TypeError(f"compute_reward_score got unexpected arguments {sorted(kwargs)}")
        return adapters.score_with_adapter(
            self, self.score, self.reward_adapter_name, input_ids, attention_mask, ppo_adapter_name
        )

    def sequence_reward_score(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> torch.Tensor:
        """One reward per sequence: `compute_reward_score` (which takes `kwargs`, e.g. ppo_adapter_name=)
        read at each row's last real token.

        The last real token comes from `attention_mask`, so left and right padding give the same scores
        (what the reward model's sequence classifier outputs). Returns (B,) for a one-output head, else
        (B, num_labels).
        """
        per_token = self.compute_reward_score(input_ids, attention_mask, **kwargs)
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        rows = torch.arange(per_token.shape[0], device=per_token.device)
        scores = per_token[rows, last_true_indices(mask).to(per_token.device)]
        return scores.squeeze(-1) if scores.shape[-1] == 1 else scores

    # ----------------------------------------------------------------- state dict
    def state_dict(
        self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False
    ) -> Any:
        """The base model's state dict plus `v_head.*` (and the reward `score.*`) keys."""
        if args:
            raise TypeError("pass state_dict arguments by keyword")
        destination = OrderedDict() if destination is None else destination
        self.pretrained_model.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)
        self.v_head.state_dict(destination=destination, prefix=prefix + "v_head.", keep_vars=keep_vars)
        if self.score is not None:
            self.score.state_dict(destination=destination, prefix=prefix + "score.", keep_vars=keep_vars)
        return destination

    def _flat_keys_to_nested(self, state_dict: dict, prefix: str, *args: Any) -> None:
        # load_state_dict accepts the flat layout written by `state_dict` above
        own = (prefix + "pretrained_model.", prefix + "v_head.", prefix + "score.")
        for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(own)]:
            state_dict[prefix + "pretrained_model." + key[len(prefix) :]] = state_dict.pop(key)

    # ----------------------------------------------------------------- save / load
    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> None:
        """Base weights (or only the adapters of a PEFT model) + `value_head.safetensors`, all safetensors.

        kwargs (e.g. `max_shard_size`) go to the base model's `save_pretrained`. A loaded reward adapter is
        not saved: it is an input, reloaded from its own folder. `state_dict` (this model's `state_dict()`
        layout, e.g. gathered whole from FSDP shards) is written instead of the module's own tensors.
        """
        if kwargs.pop("safe_serialization", True) is False:
            raise ValueError("rlhfkit saves safetensors only; drop safe_serialization=False")
        state_dict = kwargs.pop("state_dict", None)
        if state_dict is not None:
            heads = ("v_head.", "score.")
            kwargs["state_dict"] = {k: v for k, v in state_dict.items() if not k.startswith(heads)}
        folder = Path(save_directory)
        folder.mkdir(parents=True, exist_ok=True)
        peft_model = adapters.peft_model_of(self)
        if peft_model is None:
            self.pretrained_model.save_pretrained(folder, **kwargs)
        else:
            value_head_io.save_adapters(peft_model, folder, self.reward_adapter_name, **kwargs)
        if state_dict is None:
            state_dict = {f"v_head.{k}": v for k, v in self.v_head.state_dict().items()}
        value_head_io.write_value_head(folder, state_dict)

    def push_to_hub(self, repo_id: str, *args: Any, **kwargs: Any) -> Any:
        """Push the base model (transformers/peft `push_to_hub`), then upload the value head next to it."""
        result = self.pretrained_model.push_to_hub(repo_id, *args, **kwargs)
        value_head_io.upload_value_head(self.v_head, repo_id, kwargs.get("token"))
        return result

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike | nn.Module,
        *model_args: Any,
        peft_config: Any = None,
        reward_adapter: str | os.PathLike | None = None,
        reward_adapter_name: str = "reward_adapter",
        load_in_8bit: bool = False,
        load_in_4bit: bool = False,
        summary_dropout_prob: float | None = None,
        v_head_init_strategy: str | None = None,
        v_head_initializer_range: float = 0.2,
        is_trainable: bool = True,
        **model_kwargs: Any,
    ) -> PreTrainedModelWrapper:
        """Load (or wrap) a model and add a value head; see the module docstring for the folder layout.

        - A folder/Hub id of a full model: loads it with `transformers_parent_class`; with `peft_config`
          a fresh adapter (the policy) is added. The reference is then the base (adapters disabled).
        - A folder of a LoRA adapter (e.g. an SFT LoRA): loads its base and the adapter as the trainable
          policy, and keeps a frozen copy named `reference`, so the KL reference is the SFT model. To put
          a *fresh* adapter on top of an SFT LoRA instead, merge it first (`merge_and_unload()`), save,
          and load that folder with `peft_config`.
        - A folder written by this class's `save_pretrained`: restores every saved adapter, which one was
          active, the reference adapter (if there was one) and the value head.
        - An already built transformers model or PeftModel: wrapped as is.
        `reward_adapter` loads a frozen LoRA reward adapter + score head (needs a PEFT policy).
        `load_in_8bit` / `load_in_4bit` quantise the base with bitsandbytes (`rlhfkit[quant]`).
        """
        # fail before loading weights (None: the config's value or 0.1, settled once the model is loaded)
        _check_head_args(0.1 if summary_dropout_prob is None else summary_dropout_prob, v_head_init_strategy)
        if reward_adapter is not None and cls.is_encoder_decoder:
            raise ValueError("reward_adapter is supported for causal language models only")
        model, source = value_head_io.base_model(
            cls.transformers_parent_class,
            pretrained_model_name_or_path,
            model_args,
            peft_config=peft_config,
            is_trainable=is_trainable,
            load_in_8bit=load_in_8bit,
            load_in_4bit=load_in_4bit,
            model_kwargs=model_kwargs,
        )
        wrapper = cls(
            model,
            summary_dropout_prob=summary_dropout_prob,
            v_head_init_strategy=v_head_init_strategy,
            v_head_initializer_range=v_head_initializer_range,
        )
        if source is not None:  # loaded by name: the saved value head, if any, sits next to the base
            wrapper._load_value_head(source)
        if reward_adapter is not None:
            wrapper.load_reward_adapter(reward_adapter, reward_adapter_name)
        return wrapper

    def _load_value_head(self, source: str) -> None:
        state = value_head_io.read_value_head(source)
        if state is None:
            warnings.warn(
                f"no value head found in {source!r}; using a freshly initialised one (expected when starting "
                "RL from a plain language model)",
                stacklevel=3,
            )
            return
        self.v_head.load_state_dict({k: v.float() for k, v in state.items()})


class AutoModelForCausalLMWithValueHead(PreTrainedModelWrapper):
    """A causal LM with a value head: `forward` returns `(lm_logits, loss, values)`."""

    from transformers import AutoModelForCausalLM as transformers_parent_class  # noqa: N813

    def forward(self, *args: Any, **kwargs: Any) -> tuple:
        kwargs.pop("token_type_ids", None)  # fast tokenizers may emit them; GPT-2/Llama must not get them
        return super().forward(*args, **kwargs)

    def _last_hidden_state(self, outputs: Any) -> torch.Tensor:
        return outputs.hidden_states[-1]


class AutoModelForSeq2SeqLMWithValueHead(PreTrainedModelWrapper):
    """An encoder-decoder LM with a value head on the decoder: one value per decoder token."""

    from transformers import AutoModelForSeq2SeqLM as transformers_parent_class  # noqa: N813

    is_encoder_decoder = True
    lm_head_namings = ("lm_head", "embed_out", "output_projection")

    def _last_hidden_state(self, outputs: Any) -> torch.Tensor:
        return outputs.decoder_hidden_states[-1]
