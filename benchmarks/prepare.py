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
FORMAT = 4  # bump when the written files change


def _compat_config(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    rope = config.get("rope_parameters") or {}
    if config.get("model_type") == "llama":
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
        info[size] = {"policy_params": _count_params(policy_out), "reward_params": _count_params(reward_out),
                      "config": json.loads((policy_out / "config.json").read_text())}
    return info


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
    """transformers 5 saves CLIPTextModel weights without the `text_model.` prefix 4.x expects; 5.x reads both."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    renamed = {k if k.startswith("text_model.") else f"text_model.{k}": v.contiguous() for k, v in tensors.items()}
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
    """A text of exactly `n_tokens` tokens, cut from the corpus word stream at `start` (None if no cut fits)."""
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
    _write_jsonl(data / "prompts.jsonl", [
        {"prompt": p, "input_ids": tokenizer(p, add_special_tokens=False)["input_ids"]} for p in prompts
    ])
    # SFT rows run past max_length, so every row is truncated to exactly SFT_MAX_LENGTH tokens (+ eos if added)
    sft = _texts(tokenizer, words, SFT_ROWS, SFT_MAX_LENGTH + 16, rng)
    _write_jsonl(data / "sft.jsonl", [{"text": t} for t in sft])
    pref_prompts = _texts(tokenizer, words, PREF_ROWS, PREF_PROMPT_TOKENS, rng)
    chosen = _texts(tokenizer, words, PREF_ROWS, PREF_COMPLETION_TOKENS, rng)
    rejected = _texts(tokenizer, words, PREF_ROWS, PREF_COMPLETION_TOKENS, rng)
    rows = [{"prompt": p, "chosen": " " + c, "rejected": " " + r} for p, c, r in zip(pref_prompts, chosen, rejected)]
    _write_jsonl(data / "preference.jsonl", rows)
    return {
        "prompt_tokens": PROMPT_TOKENS, "sft_max_length": SFT_MAX_LENGTH,
        "pref_prompt_tokens": PREF_PROMPT_TOKENS, "pref_completion_tokens": PREF_COMPLETION_TOKENS,
    }


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def prepare(work: Path, sizes: list[str] = ("tiny", "small"), sd: bool = True, force: bool = False) -> dict:
    """Build what is asked for once; what meta.json already lists (same FORMAT) is kept."""
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        raise ValueError(f"sizes: unknown {bad}; expected some of {list(SIZES)}")
    meta_path = work / "data" / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() and not force else {}
    if meta.get("format") != FORMAT:
        meta = {"format": FORMAT, "models": {}, "sd": False}
    missing = [s for s in sizes if s not in meta["models"]]
    if missing:
        meta["models"].update(write_models(work, missing))
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
    parser.add_argument("--sizes", default="tiny,small", help="comma list of model sizes: tiny, small")
    parser.add_argument("--sd", action="store_true", help="also write the tiny Stable Diffusion (DDPO)")
    parser.add_argument("--force", action="store_true", help="rebuild even if meta.json is current")
    args = parser.parse_args()
    meta = prepare(Path(args.work_dir), [s for s in args.sizes.split(",") if s], args.sd, args.force)
    print(json.dumps({k: v["policy_params"] for k, v in meta["models"].items()}))


if __name__ == "__main__":
    main()
