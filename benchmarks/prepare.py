"""Write the benchmark's models and data into benchmarks/.work, readable by transformers 4.46 and 5.x.

Runs in rlhfkit's own venv. The tiny models come from `rlhfkit.testing`; transformers 5 writes a few fields
that 4.x does not understand (`tokenizer_class: TokenizersBackend`, `rope_parameters`, `dtype`,
`extra_special_tokens` as a list, the chat template in its own file), so each folder is rewritten with both
spellings. `benchmarks/parity.py` then checks that both libraries compute the same logits from it.

Data: fixed-length prompts (exactly PROMPT_TOKENS tokens each, so both sides generate from identical
inputs), SFT texts longer than SFT_MAX_LENGTH (every row is truncated to the same length) and preference
triples (prompt, chosen, rejected) of fixed token lengths.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

PROMPT_TOKENS = 16
NUM_PROMPTS = 256
SFT_MAX_LENGTH = 128
SFT_ROWS = 512
PREF_PROMPT_TOKENS = 32
PREF_COMPLETION_TOKENS = 32
PREF_ROWS = 512
SIZES = {"tiny": ("llama", "llama-reward"), "small": ("llama-small", None)}
# Large-vocabulary models (issue 16): hidden 64, 2 layers, vocabularies up to Qwen2's 151,936 tokens.
# `v152k-eos` is v152k whose eos logit is raised so sampled completions stop at spread-out lengths.
# `v152k-h32` is v152k with 2 attention heads of 32 instead of 4 of 16 (the same weights' sizes): vLLM's CPU
# attention takes head sizes of 32 and up, so the vLLM benchmark (vllm_generation.py) samples from it.
VOCAB_SIZES = {"v1k": 1000, "v8k": 8192, "v32k": 32000, "v152k": 151_936, "v152k-eos": 151_936,
               "v152k-h32": 151_936, "v152k-q05": 151_936}  # fmt: skip
# The shape users train (issue 32): `v152k-q05` is Qwen2.5-0.5B's architecture (24 layers, hidden 896, 14
# query and 2 key/value heads, MLP 4,864, tied 151,936-token embeddings) with seeded random weights and the
# word-level tokenizer; its workloads score with rules, so no reward model is written for it.
REAL_SHAPES = {
    "v152k-q05": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
    ),
}  # fmt: skip
LV_QUERY_TOKENS = 6
LV_LENGTHS = (64, 128, 256, 512, 1024)  # completion lengths the large-vocabulary preference data come in
EOS_MEAN_LENGTH = 128  # v152k-eos: expected tokens before eos at temperature 1 (geometric)
FORMAT = 4  # bump when the written files change


def _compat_config(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    rope = config.get("rope_parameters") or {}
    if config.get("model_type") in ("llama", "qwen2"):
        config.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
        config.setdefault("rope_scaling", None)
    config.setdefault("torch_dtype", config.get("dtype", "float32"))
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _compat_tokenizer(folder: Path) -> None:
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.pop("backend", None)
    extra = config.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        config["additional_special_tokens"] = extra
    template = folder / "chat_template.jinja"
    if template.is_file():
        config["chat_template"] = template.read_text()
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    special = {k: config[k] for k in ("bos_token", "eos_token", "pad_token") if k in config}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def _reward_from_policy(policy_dir: Path, out: Path) -> None:
    """A one-output sequence classifier on the policy's backbone with a seeded score head."""
    import torch
    from transformers import AutoModelForSequenceClassification

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        model = AutoModelForSequenceClassification.from_pretrained(policy_dir, num_labels=1)
        torch.nn.init.normal_(model.score.weight, std=0.02)
    model.config.pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 1
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (policy_dir / name).is_file():
            shutil.copyfile(policy_dir / name, out / name)


def write_models(work: Path, sizes: list[str]) -> dict:
    from rlhfkit.testing import tiny_model_path

    info = {}
    for size in sizes:
        policy_name, reward_name = SIZES[size]
        src = tiny_model_path(policy_name)
        policy_out = work / "models" / f"{size}-policy"
        reward_out = work / "models" / f"{size}-reward"
        for folder in (policy_out, reward_out):
            shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(src, policy_out)
        if reward_name is not None:
            shutil.copytree(tiny_model_path(reward_name), reward_out)
        else:
            _reward_from_policy(src, reward_out)
        for folder in (policy_out, reward_out):
            _compat_config(folder)
            _compat_tokenizer(folder)
        info[size] = {
            "policy_params": _count_params(policy_out),
            "reward_params": _count_params(reward_out),
            "config": json.loads((policy_out / "config.json").read_text()),
        }
    return info


def _word_tokenizer(vocab_size: int):
    """A word-level tokenizer with `vocab_size` ids: 0 eos/bos, 1 pad, then words w2, w3, ...

    Text of n space-separated words is exactly n tokens and decodes back to itself, so both libraries
    see the same token counts whether they pass ids (rlhfkit) or decode and re-tokenise text (TRL 1.16).
    """
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "<|pad|>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<|pad|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(
        [AddedToken("<|endoftext|>", special=True), AddedToken("<|pad|>", special=True)]
    )
    return tokenizer


def _raise_eos(model, mean_length: int) -> None:
    """Make eos about 1/mean_length likely at every position (temperature 1), whatever the context.

    Every token embedding gets a shared offset along hidden dimension 0, so the normalised final hidden
    state always has a large, steady component there; eos's head row reads it. Other logits stay near
    uniform, so sampled lengths spread out geometrically (some stop at once, some run to the limit).
    """
    import math

    import torch

    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb[:, 0] += 4 * emb[:, 1:].std()
        probe = torch.randint(2, emb.shape[0], (8, 32))
        hidden = model.model(input_ids=probe).last_hidden_state[..., 0].mean()
        vocab = emb.shape[0]
        target = math.log(vocab / (mean_length - 1))  # p(eos) = e^z / (e^z + V) = 1 / mean_length
        head = model.get_output_embeddings().weight
        head[0] = 0.0
        head[0, 0] = target / hidden


def write_vocab_model(work: Path, name: str) -> dict:
    """Policy and reward model of one large-vocabulary size, built from a seeded config."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab_size = VOCAB_SIZES[name]
    ids = dict(
        vocab_size=vocab_size, max_position_embeddings=2048, bos_token_id=0, eos_token_id=0, pad_token_id=1
    )
    torch.manual_seed(0)
    if name in REAL_SHAPES:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        model = Qwen2ForCausalLM(Qwen2Config(**ids, **REAL_SHAPES[name]))
    else:
        heads = 2 if name == "v152k-h32" else 4
        config = LlamaConfig(
            **ids, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=heads,
            num_key_value_heads=heads, tie_word_embeddings=False,
        )  # fmt: skip
        model = LlamaForCausalLM(config)
    if name.endswith("-eos"):
        _raise_eos(model, EOS_MEAN_LENGTH)
    policy_out, reward_out = work / "models" / f"{name}-policy", work / "models" / f"{name}-reward"
    shutil.rmtree(policy_out, ignore_errors=True)
    shutil.rmtree(reward_out, ignore_errors=True)
    model.save_pretrained(policy_out)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_word_tokenizer(vocab_size),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        padding_side="left",
        model_max_length=4096,
    )
    tokenizer.save_pretrained(policy_out)
    folders = [policy_out]
    if name not in REAL_SHAPES:
        _reward_from_policy(policy_out, reward_out)
        folders.append(reward_out)
    for folder in folders:
        _compat_config(folder)
        _compat_tokenizer(folder)
    return {
        "policy_params": _count_params(policy_out),
        "reward_params": _count_params(reward_out) if reward_out in folders else None,
        "config": json.loads((policy_out / "config.json").read_text()),
    }


def write_vocab_data(work: Path) -> None:
    """6-token prompts and fixed-length preference pairs over words w2..w999 (valid in every vocabulary)."""
    rng = random.Random(0)
    data = work / "data" / "lv"
    data.mkdir(parents=True, exist_ok=True)

    def words(n: int) -> list[int]:
        return [rng.randrange(2, 1000) for _ in range(n)]

    def text(ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)

    prompts = [words(LV_QUERY_TOKENS) for _ in range(NUM_PROMPTS)]
    _write_jsonl(data / "prompts.jsonl", [{"prompt": text(p), "input_ids": p} for p in prompts])
    for length in LV_LENGTHS:
        rows = [
            {
                "prompt": text(words(LV_QUERY_TOKENS)),
                "chosen": " " + text(words(length)),
                "rejected": " " + text(words(length)),
            }
            for _ in range(64)
        ]
        _write_jsonl(data / f"preference-{length}.jsonl", rows)


def write_sd_pipeline(work: Path) -> None:
    """The tiny Stable Diffusion folder for DDPO, with the slow CLIP tokenizer files diffusers 0.31 reads."""
    from rlhfkit.testing.diffusion import tiny_sd_pipeline_path

    out = work / "models" / "sd"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(tiny_sd_pipeline_path(), out)
    _compat_config(out / "text_encoder")
    _prefix_clip_keys(out / "text_encoder" / "model.safetensors")
    tok_dir = out / "tokenizer"
    model = json.loads((tok_dir / "tokenizer.json").read_text())["model"]
    (tok_dir / "vocab.json").write_text(json.dumps(model["vocab"]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (tok_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    for key in ("backend", "is_local", "local_files_only"):
        config.pop(key, None)
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _prefix_clip_keys(path: Path) -> None:
    """transformers 5 saves CLIPTextModel weights without the `text_model.` prefix 4.x expects; 5.x reads
    both."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    renamed = {
        k if k.startswith("text_model.") else f"text_model.{k}": v.contiguous() for k, v in tensors.items()
    }
    save_file(renamed, str(path), metadata={"format": "pt"})


def _count_params(folder: Path) -> int:
    from safetensors import safe_open

    total = 0
    with safe_open(str(folder / "model.safetensors"), framework="pt") as fh:
        for key in fh.keys():
            total += _prod(fh.get_slice(key).get_shape())
    return total


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _sentences() -> list[str]:
    from importlib.resources import files

    text = files("rlhfkit.testing").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def _exact_text(tokenizer, words: list[str], start: int, n_tokens: int) -> str | None:
    """A text of exactly `n_tokens` tokens, cut from the corpus word stream at `start` (None if no cut
    fits)."""
    ids = tokenizer(" ".join(words[start : start + 4 * n_tokens]), add_special_tokens=False)["input_ids"]
    if len(ids) < n_tokens:
        return None
    text = tokenizer.decode(ids[:n_tokens])
    if len(tokenizer(text, add_special_tokens=False)["input_ids"]) != n_tokens:
        return None
    return text


def _texts(tokenizer, words: list[str], n_rows: int, n_tokens: int, rng: random.Random) -> list[str]:
    out: list[str] = []
    while len(out) < n_rows:
        text = _exact_text(tokenizer, words, rng.randrange(len(words) - 8 * n_tokens), n_tokens)
        if text is not None and text.strip() == text:
            out.append(text)
    return out


def write_data(work: Path) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(work / "models" / "tiny-policy")
    words = " ".join(_sentences()).split()
    rng = random.Random(0)
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    prompts = _texts(tokenizer, words, NUM_PROMPTS, PROMPT_TOKENS, rng)
    _write_jsonl(
        data / "prompts.jsonl",
        [{"prompt": p, "input_ids": tokenizer(p, add_special_tokens=False)["input_ids"]} for p in prompts],
    )
    # SFT rows run past max_length, so every row is truncated to exactly SFT_MAX_LENGTH tokens
    # (+ eos if added)
    sft = _texts(tokenizer, words, SFT_ROWS, SFT_MAX_LENGTH + 16, rng)
    _write_jsonl(data / "sft.jsonl", [{"text": t} for t in sft])
    pref_prompts = _texts(tokenizer, words, PREF_ROWS, PREF_PROMPT_TOKENS, rng)
    chosen = _texts(tokenizer, words, PREF_ROWS, PREF_COMPLETION_TOKENS, rng)
    rejected = _texts(tokenizer, words, PREF_ROWS, PREF_COMPLETION_TOKENS, rng)
    rows = [
        {"prompt": p, "chosen": " " + c, "rejected": " " + r}
        for p, c, r in zip(pref_prompts, chosen, rejected)
    ]
    _write_jsonl(data / "preference.jsonl", rows)
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "sft_max_length": SFT_MAX_LENGTH,
        "pref_prompt_tokens": PREF_PROMPT_TOKENS,
        "pref_completion_tokens": PREF_COMPLETION_TOKENS,
    }


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def prepare(work: Path, sizes: list[str] = ("tiny", "small"), sd: bool = True, force: bool = False) -> dict:
    """Build what is asked for once; what meta.json already lists (same FORMAT) is kept."""
    bad = [s for s in sizes if s not in SIZES and s not in VOCAB_SIZES]
    if bad:
        raise ValueError(f"sizes: unknown {bad}; expected some of {list(SIZES) + list(VOCAB_SIZES)}")
    meta_path = work / "data" / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() and not force else {}
    if meta.get("format") != FORMAT:
        meta = {"format": FORMAT, "models": {}, "sd": False}
    missing = [s for s in sizes if s not in meta["models"]]
    if [s for s in missing if s in SIZES]:
        meta["models"].update(write_models(work, [s for s in missing if s in SIZES]))
    for name in (s for s in missing if s in VOCAB_SIZES):
        meta["models"][name] = write_vocab_model(work, name)
    if any(s in VOCAB_SIZES for s in sizes) and not meta.get("lv_data"):
        write_vocab_data(work)
        meta["lv_data"] = {"query_tokens": LV_QUERY_TOKENS, "preference_lengths": list(LV_LENGTHS)}
    if sd and not meta.get("sd"):
        write_sd_pipeline(work)
        meta["sd"] = True
    if "prompt_tokens" not in meta:
        # the data are tokenised with the tiny tokenizer (shared by every size), so the tiny folder must exist
        if "tiny" not in meta["models"]:
            meta["models"].update(write_models(work, ["tiny"]))
        meta.update(write_data(work))
    meta_path.parent.mkdir(parents=True, exist_ok=True)
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default=str(Path(__file__).parent / ".work"))
    parser.add_argument(
        "--sizes",
        default="tiny,small",
        help=f"comma list of model sizes: {', '.join(list(SIZES) + list(VOCAB_SIZES))}",
    )
    parser.add_argument("--sd", action="store_true", help="also write the tiny Stable Diffusion (DDPO)")
    parser.add_argument("--force", action="store_true", help="rebuild even if meta.json is current")
    args = parser.parse_args()
    meta = prepare(Path(args.work_dir), [s for s in args.sizes.split(",") if s], args.sd, args.force)
    print(json.dumps({k: v["policy_params"] for k, v in meta["models"].items()}))


if __name__ == "__main__":
    main()
