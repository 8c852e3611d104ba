"""Group failure reasons into causes, so the report ranks what to build next by tests it would fix."""

from __future__ import annotations

import re

# (pattern on the one-line reason, cause template using the pattern's groups)
_RULES = [
    (r"RlhfkitLacks: rlhfkit has no (\S+)", "rlhfkit lacks {0}"),
    (r"HarnessUnmapped: (.*)", "harness: {0}"),
    (r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'", "{0} has no argument/field '{1}'"),
    (r"got an unexpected keyword argument '(\w+)'", "unknown keyword argument '{0}'"),
    (r"'(\w+)' object has no attribute '(\w+)'", "{0} has no attribute '{1}'"),
    (r"Timeout", "timeout"),
    (r"^(\w+(?:Error|Exception)): (.{0,80})", "{0}: {1}"),
]


def cause_of(reason: str) -> str:
    """A short cause for a one-line failure reason; the same cause for failures that share a fix."""
    for pattern, template in _RULES:
        match = re.search(pattern, reason)
        if match:
            return template.format(*match.groups())
    return re.sub(r"\d+(\.\d+)?", "N", reason)[:100]


# (pattern on the one-line reason, theme): broader than causes, one fix each in rlhfkit (or the harness)
_THEMES = [
    (r"HarnessUnmapped.*(zen-image|zen-multi-image|multimodal)", "harness: vision-language models/datasets"),
    (r"HarnessUnmapped", "harness: other hub ids (toolcall/harmony datasets, remote code, Qwen token ids)"),
    (r"IterableDataset|num_proc", "IterableDataset (streaming) train/eval datasets"),
    (r"aux_loss_enabled", "trainer attribute aux_loss_enabled (MoE router aux loss)"),
    (r"DataCollatorFor", "TRL 1.x collators (DataCollatorForPreference, DataCollatorForLanguageModeling)"),
    (r"_chunked_cross_entropy|_patch_chunked|dft_loss", "SFT module-level helpers (chunked CE, dft_loss)"),
    (
        r"prompt_input_ids|chosen_ids|prompt_ids|'input_ids'|'labels'|input_ids_chosen|features lack",
        "tokenised columns differ from TRL 1.x (prompt_ids, chosen_ids, input_ids, labels; eval sets)",
    ),
    (r"unexpected keyword argument|missing 1 required", "config fields / arguments TRL 1.x has"),
    (r"has no attribute 'get_|has no attribute '_", "TRL trainer methods tests call directly"),
    (r"has no attribute", "TRL trainer attributes (ref_model, reward_processing_classes, ...)"),
    (r"loss_type must be one of", "GRPO loss types (sapo, luspo, vespo)"),
    (
        r"eval_\w*loss|mean_token_accuracy|rewards/|KeyError: 'reward'|None is not None|metric_for_best",
        "logged metric names/values",
    ),
    (r"DID NOT RAISE|DID NOT WARN|Regex pattern did not match|not triggered", "validation errors, warnings"),
    (r"NoneType' is not iterable", "model tags (model.model_tags) not set"),
    (r"NonFiniteError", "rlhfkit's non-finite guard stops runs TRL lets continue"),
    (r"FSMT|ModuleList has no attribute", "value head on other architectures (FSMT lm head, shared layers)"),
    (r"Timeout", "timeout"),
]


def theme_of(reason: str) -> str:
    """The broad theme of a failure reason (see `_THEMES`), "other" when none applies."""
    return next((theme for pattern, theme in _THEMES if re.search(pattern, reason)), "other")
