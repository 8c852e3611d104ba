"""Check that every venv reads the benchmark models identically before anything is timed.

`python parity.py dump --tag NAME` (run inside each venv) tokenises a few prompts, runs the policy and the
reward model and saves token ids, logits and reward scores to .work/parity/NAME-SIZE.npz.
`python parity.py compare` (any venv) checks every dump against the first: identical token ids, logits
within 1e-4 (float32 kernels may round differently across torch/transformers versions, nothing more).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TOLERANCE = 1e-4
NUM_PROMPTS = 4
# those prepare.py has written are checked
SIZES = ("tiny", "small", "v1k", "v8k", "v32k", "v152k", "v152k-eos")


def dump(work: Path, tag: str) -> list[Path]:
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    out_dir = work / "parity"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for size in SIZES:
        policy_dir, reward_dir = work / "models" / f"{size}-policy", work / "models" / f"{size}-reward"
        if not policy_dir.is_dir():
            continue
        prompts = _prompts(work / "data" / ("lv" if size.startswith("v") else "") / "prompts.jsonl")
        tokenizer = AutoTokenizer.from_pretrained(policy_dir)
        ids = [tokenizer(p["prompt"], add_special_tokens=False)["input_ids"] for p in prompts]
        if ids != [p["input_ids"] for p in prompts]:
            raise SystemExit(
                f"[parity] {tag}: tokenizer of {policy_dir} does not reproduce the stored prompt ids"
            )
        input_ids = torch.tensor(ids)
        policy = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
        reward = AutoModelForSequenceClassification.from_pretrained(reward_dir).eval()
        with torch.no_grad():
            logits = policy(input_ids=input_ids).logits.float().numpy()
            scores = reward(input_ids=input_ids).logits.float().numpy()
        path = out_dir / f"{tag}-{size}.npz"
        np.savez(
            path,
            input_ids=input_ids.numpy(),
            logits=logits,
            scores=scores,
            transformers=np.array(transformers.__version__),
        )
        written.append(path)
    sd_path = _dump_sd(work, tag)
    return written + ([sd_path] if sd_path else [])


def _prompts(path: Path) -> list[dict]:
    prompts = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            prompts.append(json.loads(line))
            if len(prompts) == NUM_PROMPTS:
                break
    return prompts


def _dump_sd(work: Path, tag: str) -> Path | None:
    """Text-encoder states and one UNet prediction of the tiny Stable Diffusion (venvs with diffusers
    only)."""
    import importlib.util

    if importlib.util.find_spec("diffusers") is None or not (work / "models" / "sd").is_dir():
        return None
    import numpy as np
    import torch
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(
        work / "models" / "sd", safety_checker=None, requires_safety_checker=False
    )
    ids = pipe.tokenizer(
        ["a photo of a cat", "a red bird"],
        padding="max_length",
        max_length=pipe.tokenizer.model_max_length,
        return_tensors="pt",
    ).input_ids
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, pipe.unet.config.in_channels, 8, 8, generator=generator)
    with torch.no_grad():
        states = pipe.text_encoder(ids)[0]
        noise = pipe.unet(latents, 5, encoder_hidden_states=states).sample
    path = work / "parity" / f"{tag}-sd.npz"
    np.savez(path, input_ids=ids.numpy(), logits=noise.numpy(), scores=states.numpy())
    return path


def compare(work: Path) -> bool:
    import numpy as np

    ok = True
    for size in (*SIZES, "sd"):
        dumps = sorted((work / "parity").glob(f"*-{size}.npz"))
        if len(dumps) < 2:
            print(f"[parity] {size}: only {len(dumps)} dump(s), nothing to compare")
            continue
        first = np.load(dumps[0])
        for other_path in dumps[1:]:
            other = np.load(other_path)
            same_ids = np.array_equal(first["input_ids"], other["input_ids"])
            dlogits = float(np.abs(first["logits"] - other["logits"]).max())
            dscores = float(np.abs(first["scores"] - other["scores"]).max())
            good = same_ids and dlogits <= TOLERANCE and dscores <= TOLERANCE
            ok = ok and good
            print(
                f"[parity] {size}: {dumps[0].stem} vs {other_path.stem}: ids equal={same_ids} "
                f"max|dlogits|={dlogits:.2e} max|dscores|={dscores:.2e} -> {'OK' if good else 'MISMATCH'}"
            )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["dump", "compare"])
    parser.add_argument("--tag", default="rlhfkit")
    parser.add_argument("--work-dir", default=str(Path(__file__).parent / ".work"))
    args = parser.parse_args()
    work = Path(args.work_dir)
    if args.action == "dump":
        for path in dump(work, args.tag):
            print(f"[parity] wrote {path}")
    elif not compare(work):
        sys.exit(1)


if __name__ == "__main__":
    main()
