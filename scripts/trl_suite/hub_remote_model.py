"""Local stand-in for `trl-internal-testing/tiny-RemoteForCausalLM`, a model whose class is custom code.

The folder holds its own configuration and modeling modules, named in `config.json`'s `auto_map`, and a
`model_type` transformers does not know: it loads only with `trust_remote_code=True`, as the hub copy
does, and without it transformers refuses with its "contains custom code" error. The custom classes
are thin subclasses of transformers' Qwen2 ones (the architecture does not matter to the tests, only
that the class comes from the folder), so the weights are a tiny random Qwen2's.
"""

from __future__ import annotations

import json
from pathlib import Path

REMOTE_ID = "trl-internal-testing/tiny-RemoteForCausalLM"
MODEL_TYPE = "rlhfkit_remote"

CONFIGURATION = f'''"""Configuration of the remote-code stand-in (written by rlhfkit's TRL-suite harness)."""

from transformers import Qwen2Config


class RemoteConfig(Qwen2Config):
    model_type = "{MODEL_TYPE}"
'''

MODELING = '''"""Model classes of the remote-code stand-in (written by rlhfkit's TRL-suite harness)."""

from torch import nn
from transformers import Qwen2ForCausalLM, Qwen2ForSequenceClassification, Qwen2Model, Qwen2PreTrainedModel

from .configuration_remote import RemoteConfig


class RemoteModel(Qwen2Model):
    config_class = RemoteConfig


class RemoteForCausalLM(Qwen2ForCausalLM):
    config_class = RemoteConfig


class RemoteForSequenceClassification(Qwen2ForSequenceClassification):
    config_class = RemoteConfig

    def __init__(self, config):
        # the parent builds its trunk through AutoModel, which does not know this config type
        Qwen2PreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = RemoteModel(config)
        self.score = nn.Linear(config.hidden_size, self.num_labels, bias=False)
        self.post_init()
'''

AUTO_MAP = {
    "AutoConfig": "configuration_remote.RemoteConfig",
    "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM",
    "AutoModelForSequenceClassification": "modeling_remote.RemoteForSequenceClassification",
}


def build_remote_model(out: Path, tiny_config, tokenizer) -> None:
    """Write the custom-code folder into `out`: tiny Qwen2 weights, the two modules, an `auto_map`."""
    import torch
    from transformers import Qwen2ForCausalLM

    from rlhfkit.testing.models import SEED

    config = tiny_config(Qwen2ForCausalLM, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "configuration_remote.py").write_text(CONFIGURATION, encoding="utf-8")
    (out / "modeling_remote.py").write_text(MODELING, encoding="utf-8")
    saved = json.loads((out / "config.json").read_text(encoding="utf-8"))
    saved.update(model_type=MODEL_TYPE, architectures=["RemoteForCausalLM"], auto_map=AUTO_MAP)
    (out / "config.json").write_text(json.dumps(saved, indent=2), encoding="utf-8")
