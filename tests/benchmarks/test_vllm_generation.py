"""benchmarks/vllm_generation.py's pure parts: the prompts, TRL's token count, the arguments, the model
folder; and prepare.py's v152k-h32, the tiny model that vLLM's CPU attention can run."""

from __future__ import annotations

import pytest
import torch
from test_harness import _load
from transformers import LlamaConfig, LlamaForCausalLM

bench = _load("vllm_generation")


class _Built(Exception):
    """Raised instead of writing a model: the test stops prepare.py there."""


def test_prompts_are_seeded_word_lists_of_one_token_each():
    prepare = _load("prepare")
    texts = bench.prompt_texts()
    assert texts == bench.prompt_texts() and texts != bench.prompt_texts(seed=1)
    assert len(texts) == bench.PROMPTS and len(bench.prompt_texts(12)) == 12
    tokenizer = prepare._word_tokenizer(151_936)
    for text in texts:
        ids = tokenizer.encode(text).ids
        assert len(ids) == bench.PROMPT_WORDS and all(2 <= i < 1000 for i in ids)  # no unknown (pad) token


def test_trl_token_count_keeps_each_row_through_its_first_eos():
    eos = 0
    completions = torch.tensor(
        [
            [5, 6, 0, 7, 0],  # eos third: 3 tokens
            [5, 6, 7, 8, 9],  # no eos: all 5
            [0, 6, 7, 8, 0],  # eos first: 1
        ]
    )
    assert bench.tokens_through_first_eos(completions, eos) == 3 + 5 + 1


def test_arguments_are_checked_with_the_flag_named():
    assert bench.parse_args([]).paths == list(bench.SAMPLE_PATHS + bench.GRPO_PATHS)
    assert bench.parse_args(["--paths", "decode-loop,grpo-vllm-server"]).paths == [
        "decode-loop",
        "grpo-vllm-server",
    ]
    for bad in (["--paths", "decode-loop,vllm"], ["--grpo-steps", "1"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_a_model_is_a_prepare_name_or_a_folder(tmp_path):
    args = bench.parse_args(["--work-dir", str(tmp_path / "work")])
    assert bench._folder(args, "v152k-h32") == tmp_path / "work" / "models" / "v152k-h32-policy"
    assert bench._label("v152k-h32") == "v152k-h32"
    assert bench._folder(args, str(tmp_path)) == tmp_path and bench._label(str(tmp_path)) == tmp_path.name


def test_v152k_h32_has_v152k_weights_with_heads_of_32(tmp_path, monkeypatch):
    prepare = _load("prepare")
    built = {}

    def keep(self, folder, *args, **kwargs):  # no files: only the configs are compared
        built[folder.name] = self.config
        raise _Built

    monkeypatch.setattr(LlamaForCausalLM, "save_pretrained", keep)
    for name in ("v152k", "v152k-h32"):
        with pytest.raises(_Built):
            prepare.write_vocab_model(tmp_path, name)
    small, wide = built["v152k-policy"], built["v152k-h32-policy"]
    assert (small.head_dim, wide.head_dim) == (16, 32)  # vLLM's CPU attention takes 32 and up
    with torch.device("meta"):
        sizes = [
            [p.shape for p in LlamaForCausalLM(LlamaConfig(**c.to_dict())).parameters()]
            for c in (small, wide)
        ]
    assert sizes[0] == sizes[1]
