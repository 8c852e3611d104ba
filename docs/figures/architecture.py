"""Draw docs/figures/architecture.png: how one rollout flows through an online trainer.

Run `python docs/figures/architecture.py` after moving a step to another file; the test
`tests/test_architecture_figure.py` fails while a file named here no longer exists.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).with_suffix(".png")

# (step, what happens, the file that does it), in the order a rollout meets them.
STAGES = [
    (
        "prompts",
        "a batch of prompts (dataset rows, or PPO's query tensors)",
        "src/rlhfkit/trainers/common/prompts.py",
    ),
    (
        "1. generate",
        "k completions per prompt on consecutive rows, with sampling logprobs",
        "src/rlhfkit/rollout/backends.py",
    ),
    (
        "   sampler",
        "default backend: rlhfkit's decode loop (KV cache, exact sampler)",
        "src/rlhfkit/rollout/decoding.py",
    ),
    (
        "2. score",
        "one scorer: reward functions, reward models, reward adapters, weighted",
        "src/rlhfkit/rewards/scoring.py",
    ),
    (
        "3. reference",
        "reference logprobs: frozen copy, adapter-disabled base or SFT adapter",
        "src/rlhfkit/models/reference.py",
    ),
    (
        "   forward",
        "response logprobs (and values) of policy and reference, chunked lm head",
        "src/rlhfkit/rollout/scoring.py",
    ),
    (
        "4. rewards",
        "score - kl_coef * KL per token (PPO) or per completion (RLOO)",
        "src/rlhfkit/core/rewards.py",
    ),
    (
        "5. advantages",
        "GAE (PPO); group-relative over each prompt's k completions (GRPO, RLOO)",
        "src/rlhfkit/core/advantages.py",
    ),
    (
        "6. update",
        "clipped policy-gradient steps over shuffled minibatches",
        "src/rlhfkit/trainers/common/online_loop.py",
    ),
    (
        "   loss",
        "GRPO's loss types, PPO's clipped surrogate and value loss",
        "src/rlhfkit/core/policy_losses.py",
    ),
    (
        "7. save",
        "checkpoint-<step>: safetensors, JSON state, RNG, checksums, atomic publish",
        "src/rlhfkit/trainers/common/checkpointing.py",
    ),
]
CARRIER = ("RolloutBatch", "the typed batch every step reads and fills", "src/rlhfkit/rollout/batch.py")
TRAINERS = (
    "trainers",
    "GRPO: grpo/trainer.py   RLOO: rloo/trainer.py   PPO: ppo/trainer.py step()",
    "src/rlhfkit/trainers",
)


def missing_files() -> list[str]:
    """Files named in the figure that are not in the tree (the figure has gone stale)."""
    return [f for _, _, f in (*STAGES, CARRIER, TRAINERS) if not (ROOT / f).exists()]


def draw(out: Path = OUT) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, ax = plt.subplots(figsize=(11, 0.72 * len(STAGES) + 2.2))
    ax.set_xlim(0, 11)
    ax.set_ylim(-1.6, len(STAGES) + 0.2)
    ax.axis("off")
    for i, (step, what, path) in enumerate(STAGES):
        y = len(STAGES) - 1 - i
        ax.add_patch(
            FancyBboxPatch(
                (0.2, y + 0.1),
                7.3,
                0.7,
                boxstyle="round,pad=0.02",
                facecolor="#eef3fb" if i % 2 else "#f7f9fc",
                edgecolor="#4a6fa5",
            )
        )
        ax.text(0.35, y + 0.55, step, fontsize=10, fontweight="bold", va="center")
        ax.text(1.9, y + 0.55, what, fontsize=8.5, va="center")
        ax.text(
            1.9,
            y + 0.27,
            path.removeprefix("src/rlhfkit/"),
            fontsize=8,
            family="monospace",
            color="#34495e",
            va="center",
        )
        if i:
            ax.annotate(
                "",
                xy=(3.8, y + 0.8),
                xytext=(3.8, y + 1.1),
                arrowprops={"arrowstyle": "->", "color": "#4a6fa5"},
            )
    # the batch that carries everything, beside the chain
    ax.add_patch(
        FancyBboxPatch(
            (7.9, 0.1),
            2.9,
            len(STAGES) - 0.2,
            boxstyle="round,pad=0.02",
            facecolor="#fdf5e6",
            edgecolor="#c0863a",
        )
    )
    name, what, path = CARRIER
    ax.text(9.35, len(STAGES) / 2 + 0.4, name, fontsize=11, fontweight="bold", ha="center")
    ax.text(9.35, len(STAGES) / 2, what, fontsize=8, ha="center", wrap=True)
    ax.text(
        9.35,
        len(STAGES) / 2 - 0.4,
        path.removeprefix("src/rlhfkit/"),
        fontsize=8,
        family="monospace",
        ha="center",
    )
    fields = (
        "query_ids, query_mask\nresponses, response_mask\nloss_mask, logprobs\nref_logprobs, values\n"
        "scores, advantages, returns"
    )
    ax.text(9.35, len(STAGES) / 2 - 1.9, fields, fontsize=7.5, family="monospace", ha="center")
    ax.text(0.2, -0.9, f"{TRAINERS[0]}: {TRAINERS[1]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    stale = missing_files()
    if stale:
        sys.exit(f"the figure names files that do not exist: {stale}")
    print(draw())
