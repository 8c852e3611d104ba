"""DPOConfig: TrainingArguments plus direct preference optimisation options (TRL 0.x's DPOTrainer)."""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.trainers.common.config import (
    HFTrainerConfig,
    MaxLength,
    ModelInitKwargs,
    PadToMultipleOf,
    RouterAuxLossCoef,
    SyncRefModel,
    TokenizesDatasets,
    option,
)

TRUNCATION_MODES = ("keep_end", "keep_start")
DEFAULT_MAX_PROMPT_LENGTH = 128  # TRL 0.x's


@dataclass
class DPOConfig(
    RouterAuxLossCoef,
    SyncRefModel,
    PadToMultipleOf,
    ModelInitKwargs,
    TokenizesDatasets,
    MaxLength,
    HFTrainerConfig,
):
    """Configuration for `DPOTrainer`; every `transformers.TrainingArguments` field also applies."""

    beta: float = option(
        0.1, "Strength of the implicit KL to the reference: larger beta keeps the policy closer."
    )
    loss_type: list[str] = option(
        default_factory=lambda: ["sigmoid"],
        help="The loss: a key of rlhfkit.core.losses.DPO_LOSSES ('sigmoid' is DPO; 'hinge', 'ipo', "
        "'exo_pair', 'nca_pair', 'robust', 'bco_pair', 'sppo_hard', 'aot', 'aot_unpaired', 'apo_zero', "
        "'apo_down', 'discopop', 'sft', 'sigmoid_norm'), or several, summed with loss_weights.",
    )
    loss_weights: list[float] | None = option(None, "One weight per loss_type entry (default: all 1).")
    f_divergence_type: str = option(
        "reverse_kl",
        "The divergence to the reference (f-DPO): 'reverse_kl' (DPO), 'forward_kl', 'js_divergence' or "
        "'alpha_divergence'.",
    )
    f_alpha_divergence_coef: float = option(0.5, "alpha of f_divergence_type='alpha_divergence'.")
    discopop_tau: float = option(0.05, "Temperature of the 'discopop' loss's mixing.")
    label_smoothing: float = option(
        0.0, "Assumed probability that a preference label is flipped (conservative DPO), in [0, 0.5)."
    )
    reference_free: bool = option(
        False, "Use a uniform reference (reference log-probs = 0) instead of a model."
    )
    max_prompt_length: int | None = option(
        DEFAULT_MAX_PROMPT_LENGTH,
        "Prompt tokens kept when prompt + response is longer than max_length. None: no limit. TRL 1.x has no "
        "such field: left at its default with max_length <= 128, it becomes max_length // 2.",
    )
    truncation_mode: str = option(
        "keep_end", "Which prompt tokens to keep when truncating: 'keep_end' (latest) or 'keep_start'."
    )
    label_pad_token_id: int = option(
        -100, "Label value for positions that carry no loss (prompt and padding)."
    )
    padding_value: int | None = option(
        None, "Token id used to pad input_ids. None: the tokenizer's pad token."
    )
    disable_dropout: bool = option(True, "Set dropout to 0 in the policy and reference models.")
    precompute_ref_log_probs: bool = option(
        False, "Compute reference log-probs once over the datasets, so a step runs only the policy."
    )
    precompute_ref_batch_size: int | None = option(
        None,
        "Pairs per batch while precomputing reference log-probs (None: per_device_train_batch_size for the "
        "train set, per_device_eval_batch_size for eval sets).",
    )
    use_weighting: bool = option(
        False,
        "Weight each pair's loss by WPO's w(chosen) * w(rejected) (Zhou et al. 2024): the policy's "
        "length-normalised probability of each response, relative to its own sampling distribution.",
    )
    ld_alpha: float | None = option(
        None,
        "LD-DPO (Liu et al. 2024): response tokens past the shorter side's length count with this weight in "
        "[0, 1] in the sequence log-probs (policy and reference). None: all count fully.",
    )
    padding_free: bool = option(
        False,
        "TRL 1.x's flattened, pad-free batches. As in TRL 1.16, accepted but not applied: a warning, and the "
        "batches stay padded.",
    )
    pad_token: str | None = option(
        None, "Padding token (in the tokenizer's vocabulary). None: the tokenizer's pad token, else its eos."
    )
    generate_during_eval: bool = option(
        False, "Log a few policy and reference generations at every evaluation."
    )
    max_new_tokens_eval: int = option(32, "New tokens per generation when generate_during_eval is on.")

    def validate(self) -> None:
        from rlhfkit.core.losses import DPO_LOSSES, F_DIVERGENCES

        if isinstance(self.loss_type, str):  # TRL 0.x names one loss
            self.loss_type = [self.loss_type]
        unknown = [name for name in self.loss_type if name not in DPO_LOSSES]
        if unknown or not self.loss_type:
            raise ValueError(
                f"loss_type must be one of {sorted(DPO_LOSSES)} (or a list of them), got {self.loss_type!r}"
            )
        if self.loss_weights is not None and len(self.loss_weights) != len(self.loss_type):
            raise ValueError(
                f"loss_weights has {len(self.loss_weights)} entries for {len(self.loss_type)} loss_type "
                "entries; give one weight each"
            )
        if self.f_divergence_type not in F_DIVERGENCES:
            raise ValueError(
                f"f_divergence_type must be one of {F_DIVERGENCES}, got {self.f_divergence_type!r}"
            )
        if not self.discopop_tau > 0:
            raise ValueError(f"discopop_tau must be > 0, got {self.discopop_tau}")
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.truncation_mode not in TRUNCATION_MODES:
            raise ValueError(
                f"truncation_mode must be one of {TRUNCATION_MODES}, got {self.truncation_mode!r}"
            )
        self._validate_trl1_options()
        if self.max_length is not None and self.max_prompt_length is not None:
            if self.max_prompt_length == DEFAULT_MAX_PROMPT_LENGTH >= self.max_length:  # a TRL 1.x config
                self.max_prompt_length = self.max_length // 2
            if self.max_prompt_length >= self.max_length:
                raise ValueError(
                    f"max_prompt_length ({self.max_prompt_length}) must be smaller than max_length "
                    f"({self.max_length}) to leave room for the response"
                )

    def _validate_trl1_options(self) -> None:
        """The options TRL 1.x added: WPO, LD-DPO, TR-DPO syncing, the precompute batch size."""
        if self.ld_alpha is not None and not 0.0 <= self.ld_alpha <= 1.0:
            raise ValueError(f"ld_alpha must be in [0, 1] or None, got {self.ld_alpha}")
        if self.use_weighting and {"aot", "aot_unpaired"} & set(self.loss_type):
            raise ValueError(
                "use_weighting cannot be combined with loss_type 'aot' or 'aot_unpaired': those losses sort "
                "the pairs, so a per-pair weight would land on another pair"
            )
        self.check_sync_ref_model()
        if self.sync_ref_model and (self.precompute_ref_log_probs or self.reference_free):
            what = "precompute_ref_log_probs" if self.precompute_ref_log_probs else "reference_free"
            raise ValueError(
                f"sync_ref_model cannot be combined with {what}=True: a synced reference changes during "
                "training, so there must be a reference model and its log-probs cannot be computed once"
            )
        if self.precompute_ref_batch_size is not None and self.precompute_ref_batch_size < 1:
            raise ValueError(
                "precompute_ref_batch_size must be a positive integer or None, got "
                f"{self.precompute_ref_batch_size}"
            )
