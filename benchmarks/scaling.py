"""Tables and scaling curves of the large-vocabulary runs (issue 16), from
benchmarks/large_vocab/results-*.json.

    python benchmarks/scaling.py    # -> large_vocab/TABLES.md and scaling-<workload>.png next to RESULTS.md

Nothing is measured here: run.py's `*-lv` workloads wrote the JSON files (each names its commit and command).
Per measured point (workload, vocabulary, completion length) and library: seconds per step, completions per
second, loop memory (the child's peak RSS above the import-only baseline of the same trainer) and, for runs
stopped by the memory watchdog, the size at which they ran out. Ratios are taken per pair: the rlhfkit and
TRL runs of one repeat ran back to back, so a change of machine load between repeats cancels in the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
# prepare.VOCAB_SIZES
VOCAB = {"v1k": 1000, "v8k": 8192, "v32k": 32000, "v152k": 151_936, "v152k-eos": 151_936}
TARGETS = {"memory": 1 / 3, "speed": 1.3, "eos_speed": 1.5}  # issue 16
LIBRARIES = ("rlhfkit", "trl")
# The committed files count, each for the points it measured on the current code; a new run of a point goes
# here in place of the file it supersedes (the superseded file is deleted: git history keeps it).
# ppo-lv and rloo-lv: the decode loop with its binary-search sampler fallback (74b141a and later), the chunked
# log-probabilities' tiled forward (4200a86) and the chunked head from 16 MiB of logits (4130952).
DECODE_LOOP_FILES = {
    "results-ppo-rloo-v152k-64-256.json", "results-ppo-rloo-v152k-1024.json",
    "results-ppo-rloo-v152k-eos.json", "results-ppo-rloo-vocab-sizes.json", "results-ppo-rloo-v1k.json",
}  # fmt: skip
CURRENT_ONLY = {
    "dpo-lv": {"results-dpo-v152k.json"},
    "ppo-lv": DECODE_LOOP_FILES,
    "rloo-lv": DECODE_LOOP_FILES,
}
# Points re-measured after a change to the code they run: only these files count for them (workload, model,
# length, eos). Commit 19ade00 stopped copying sliced logits in the full-logits passes, which only the
# 1,000-token batches take, so the 1,000-token pairs of results-ppo-rloo-vocab-sizes.json (02e48a5) do not
# count.
CURRENT_POINTS: dict[tuple[str, str, int, bool], set[str]] = {
    (workload, "v1k", 256, False): {"results-ppo-rloo-v1k.json"} for workload in ("ppo-lv", "rloo-lv")
}


def load(folder: Path) -> list[dict]:
    """Every run of every results-*.json in `folder`, tagged with its file, commit and command."""
    runs = []
    for path in sorted(folder.glob("results-*.json")):
        data = json.loads(path.read_text())
        baselines = data.get("import_baselines", {})
        for run in data["runs"]:
            if path.name not in CURRENT_ONLY.get(run["workload"], {path.name}):
                continue
            point = (run["workload"], run["model"], run.get("length") or 0, data["info"].get("eos", False))
            if path.name not in CURRENT_POINTS.get(point, {path.name}):
                continue
            run = dict(
                run, source=path.name, commit=data["info"].get("commit"), eos=data["info"].get("eos", False)
            )
            base = baselines.get(f"{run['library']}/{run['workload']}")
            if "os_peak_rss_mb" in run and base is not None:
                run["loop_mb"] = run["os_peak_rss_mb"] - base
            runs.append(run)
    return runs


def points(runs: list[dict]) -> list[dict]:
    """One row per (workload, model, length, eos): medians per library and per-pair ratios."""
    keys = sorted(
        {(r["workload"], r["model"], r.get("length") or 0, r["eos"]) for r in runs},
        key=lambda k: (k[0], k[3], VOCAB.get(k[1], 0), k[2]),
    )
    rows = []
    for workload, model, length, eos in keys:
        mine = [
            r
            for r in runs
            if (r["workload"], r["model"], r.get("length") or 0, r["eos"]) == (workload, model, length, eos)
        ]
        row = {
            "workload": workload,
            "model": model,
            "vocab": VOCAB.get(model),
            "length": length,
            "eos": eos,
            "sources": sorted({r["source"] for r in mine}),
            "commits": sorted({str(r["commit"]) for r in mine}),
        }
        for library in LIBRARIES:
            ok = [r for r in mine if r["library"] == library and "error" not in r]
            failed = [r for r in mine if r["library"] == library and "error" in r]
            side = {
                "runs": len(ok),
                "errors": [r.get("oom") or r["error"] for r in failed],
                "loads": [
                    (r.get("load_average_before"), r.get("load_average_after"))
                    for r in mine
                    if r["library"] == library
                ],
            }
            if ok:
                side["seconds_per_step"] = statistics.median(r["seconds_per_step"] for r in ok)
                side["episodes_per_second"] = statistics.median(r["episodes_per_second"] for r in ok)
                if all(r.get("cpu_seconds_per_step") for r in ok):
                    side["cpu_seconds_per_step"] = statistics.median(r["cpu_seconds_per_step"] for r in ok)
                side["peak_mb"] = max(r["os_peak_rss_mb"] for r in ok)
                if all("loop_mb" in r for r in ok):
                    side["loop_mb"] = max(r["loop_mb"] for r in ok)
                spans = [r["lengths"] for r in ok if r.get("lengths")]
                if spans:
                    side["lengths"] = spans
            row[library] = side
        row["pair_speed_ratios"] = _pair_ratios(mine)
        row["pair_cpu_ratios"] = _pair_ratios(mine, "cpu_seconds_per_step")
        row["pair_token_ratios"] = _pair_ratios(mine, "tokens_per_second")
        k, t = row["rlhfkit"], row["trl"]
        if "loop_mb" in k and "loop_mb" in t and t["loop_mb"] > 0:
            row["loop_memory_ratio"] = k["loop_mb"] / t["loop_mb"]
        rows.append(row)
    return rows


def _pair_ratios(runs: list[dict], metric: str = "episodes_per_second") -> list[float]:
    """rlhfkit / TRL completions per second (or TRL / rlhfkit CPU seconds per step, which other processes on
    the machine disturb less) for each pair of runs, one pair per (file, repeat), where both sides
    finished."""
    ratios = []
    for source, repeat in sorted({(r["source"], r.get("repeat", 0)) for r in runs}):
        pair = {
            r["library"]: r
            for r in runs
            if (r["source"], r.get("repeat", 0)) == (source, repeat) and "error" not in r
        }
        if set(pair) != set(LIBRARIES) or not all(pair[lib].get(metric) for lib in LIBRARIES):
            continue
        k, t = pair["rlhfkit"][metric], pair["trl"][metric]
        ratios.append(t / k if metric == "cpu_seconds_per_step" else k / t)
    return ratios


def _gb(mb: float | None) -> str:
    return "-" if mb is None else f"{mb / 1024:.2f}"


def _side(side: dict) -> tuple[str, str]:
    """(seconds per step, loop GiB) cells; a run stopped for memory reads 'OOM' with where it stopped."""
    if side.get("runs"):
        return f"{side['seconds_per_step']:.1f}", _gb(side.get("loop_mb"))
    if side.get("errors"):
        return "-", "OOM: " + side["errors"][0] if "resident" in side["errors"][0] else side["errors"][0]
    return "-", "-"


def _verdict(row: dict) -> str:
    speed_target = TARGETS["eos_speed"] if row["eos"] else TARGETS["speed"]
    ratios = row["pair_speed_ratios"]
    parts = []
    if ratios:  # wall clock and CPU time must agree before a target is called met or missed on this machine
        median, cpu = statistics.median(ratios), row.get("pair_cpu_ratios")
        calls = {median >= speed_target} | ({statistics.median(cpu) >= speed_target} if cpu else set())
        verdict = (
            "UNCLEAR (wall clock and CPU time disagree)"
            if len(calls) > 1
            else "met"
            if calls.pop()
            else "MISSED"
        )
        parts.append(f"speed {median:.2f}x {verdict} (>= {speed_target}x)")
    elif row["rlhfkit"].get("runs") and row["trl"].get("errors"):
        parts.append("TRL ran out of memory; rlhfkit ran")
    elif row["trl"].get("runs") and row["rlhfkit"].get("errors"):
        parts.append("MISSED: rlhfkit ran out of memory; TRL ran")
    if not row["eos"] and "loop_memory_ratio" in row:
        met = row["loop_memory_ratio"] <= TARGETS["memory"]
        parts.append(f"memory {row['loop_memory_ratio']:.2f}x {'met' if met else 'MISSED'} (<= 0.33x)")
    return "; ".join(parts) or "-"


def markdown(rows: list[dict], sources: dict[str, dict]) -> str:
    counted = {n for names in [*CURRENT_ONLY.values(), *CURRENT_POINTS.values()] for n in names}
    out = [
        "## Large vocabulary, realistic lengths and scaling (issue 16)",
        "",
        "Generated by `benchmarks/scaling.py` from the JSON files below (every run, its load average "
        "before and after, its log). Tiny Llama (hidden 64, 2 layers, untied head) with word-level "
        "tokenizers of 1,000 to 151,936 tokens (`prepare.py`), 6-token queries, 16 completions per step, "
        "float32, 2 threads, the timed and warm-up steps each file names below (a one-step run's peak "
        "comes before the optimizer's moments exist, on both sides). **Timings come from a shared 2-core "
        "machine** on which other sessions ran tests at the same time (1-minute load averages "
        f"{_load_range(rows)} around the runs): each ratio is taken within a pair of runs that ran back to "
        "back, libraries alternating which goes first, and the table gives every pair's ratio. Memory "
        "figures do not depend on load, but the peak RSS of the same work can differ between runs "
        "(README.md): where a point ran twice, the larger peak is shown. Loop memory is the peak RSS above "
        "the same trainer's import-only baseline. A run whose RSS passed the limit named in its JSON "
        "(`max_rss_gb`) was stopped and is listed as OOM with the size it had reached. Points re-measured "
        "after a change to the code they run count only their newest file (`CURRENT_POINTS` and "
        f"`CURRENT_ONLY` in scaling.py: {', '.join(sorted(counted))}).",
        "",
    ]
    for name, info in sources.items():
        stopped = (
            ""
            if info.get("complete", True)
            else " (stopped before its last run: the runs it lists are complete)"
        )
        steps = f"{info.get('steps', '?')} timed step(s) after {info.get('warmup', '?')} warm-up"
        out.append(
            f"- `large_vocab/{name}`: commit {info['commit']}, `{info['command']}`, {steps}, "
            f"{info['date']}{stopped}"
        )
    out += [
        "",
        "| workload | vocab | length | rlhfkit s/step | TRL s/step | rlhfkit loop GiB | TRL loop GiB | "
        "speed ratio per pair | CPU-time ratio per pair | loop memory ratio | against the targets | "
        "load before-after (rlhfkit; TRL) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["eos"]:
            continue
        (ks, km), (ts, tm) = _side(row["rlhfkit"]), _side(row["trl"])
        ratios = ", ".join(f"{x:.2f}x" for x in row["pair_speed_ratios"]) or "-"
        mem = f"{row['loop_memory_ratio']:.2f}x" if "loop_memory_ratio" in row else "-"
        cpu = ", ".join(f"{x:.2f}x" for x in row["pair_cpu_ratios"]) or "-"
        out.append(
            f"| {row['workload']} | {row['vocab']:,} | {row['length']} | {ks} | {ts} | {km} | {tm} | "
            f"{ratios} | {cpu} | {mem} | {_verdict(row)} | {_loads(row)} |"
        )
    eos_rows = [r for r in rows if r["eos"]]
    if eos_rows:
        out += [
            "",
            "### Realistic setting: completions stop at eos",
            "",
            "`v152k-eos` raises the eos logit so that each sampled token is eos with probability about 1/128 "
            "at temperature 1 (`prepare.py`), so lengths spread out geometrically up to the 256-token limit. "
            "Lengths are those of the timed steps' completions, per run.",
            "",
            "| workload | max length | rlhfkit completions/s | TRL completions/s | rlhfkit lengths "
            "min/median/max (mean) | TRL lengths min/median/max (mean) | ratio per pair | CPU-time ratio "
            "per pair | generated tokens/s ratio per pair | against the target |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in eos_rows:
            k, t = row["rlhfkit"], row["trl"]
            out.append(
                f"| {row['workload']} | {row['length']} | {_eps(k)} | {_eps(t)} | {_spans(k)} | {_spans(t)} "
                f"| {', '.join(f'{x:.2f}x' for x in row['pair_speed_ratios']) or '-'} | "
                f"{', '.join(f'{x:.2f}x' for x in row['pair_cpu_ratios']) or '-'} | "
                f"{', '.join(f'{x:.2f}x' for x in row['pair_token_ratios']) or '-'} | {_verdict(row)} |"
            )
    return "\n".join(out) + "\n"


def _loads(row: dict) -> str:
    def one(side: dict) -> str:
        return (
            ", ".join(f"{a:.1f}-{b:.1f}" for a, b in side["loads"] if a is not None and b is not None) or "-"
        )

    return f"{one(row['rlhfkit'])}; {one(row['trl'])}"


def _load_range(rows: list[dict]) -> str:
    loads = [x for r in rows for lib in LIBRARIES for pair in r[lib]["loads"] for x in pair if x is not None]
    return f"{min(loads):.1f} to {max(loads):.1f}" if loads else "not recorded"


def _eps(side: dict) -> str:
    return f"{side['episodes_per_second']:.3f}" if side.get("runs") else (side.get("errors") or ["-"])[0]


def _spans(side: dict) -> str:
    return (
        "; ".join(f"{s['min']}/{s['median']:g}/{s['max']} ({s['mean']:.0f})" for s in side.get("lengths", []))
        or "-"
    )


def plot(rows: list[dict], workload: str, out: Path) -> bool:
    """Loop memory and seconds per step against completion length (at 151,936 tokens) and against vocabulary
    (at 256 tokens), both libraries; False when there are fewer than two points on either axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in rows if r["workload"] == workload and not r["eos"]]
    by_length = sorted((r for r in mine if r["model"] == "v152k"), key=lambda r: r["length"])
    by_vocab = sorted(
        (r for r in mine if r["length"] == 256 and r["model"] != "v152k-eos"), key=lambda r: r["vocab"]
    )
    if len(by_length) < 2 and len(by_vocab) < 2:
        return False
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for col, (series, x_key, x_label) in enumerate(
        (
            (by_length, "length", "completion length (vocabulary 151,936)"),
            (by_vocab, "vocab", "vocabulary (completions of 256 tokens)"),
        )
    ):
        for row_i, (metric, y_label) in enumerate(
            (
                ("loop_mb", "loop memory above imports (GiB)"),
                ("seconds_per_step", "seconds per step (wall; CPU dotted)"),
            )
        ):
            ax = axes[row_i][col]
            for library, style in (("rlhfkit", "o-"), ("trl", "s--")):
                name = "rlhfkit" if library == "rlhfkit" else "TRL"
                xs = [r[x_key] for r in series if metric in r[library]]
                ys = [
                    r[library][metric] / (1024 if metric == "loop_mb" else 1)
                    for r in series
                    if metric in r[library]
                ]
                line = ax.plot(xs, ys, style, label=name)[0]
                if metric == "seconds_per_step":  # CPU seconds: what a busy machine disturbs less
                    cpu = [
                        (r[x_key], r[library]["cpu_seconds_per_step"])
                        for r in series
                        if "cpu_seconds_per_step" in r[library]
                    ]
                    ax.plot(
                        [x for x, _ in cpu],
                        [y for _, y in cpu],
                        style[0] + ":",
                        mfc="none",
                        color=line.get_color(),
                        label=f"{name} CPU s",
                    )
                ooms = [r[x_key] for r in series if r[library].get("errors") and not r[library].get("runs")]
                for x in ooms:
                    ax.axvline(x, color=line.get_color(), linestyle=":", alpha=0.7)
                    ax.annotate(
                        f"{'TRL' if library == 'trl' else library} OOM",
                        (x, ax.get_ylim()[1] * 0.9),
                        color=line.get_color(),
                        rotation=90,
                        ha="right",
                        va="top",
                        fontsize=8,
                    )
            ax.set_xscale("log", base=2)
            ticks = sorted({r[x_key] for r in series})
            ax.set_xticks(ticks, [f"{x:,}" for x in ticks])
            ax.minorticks_off()
            ax.set_xlabel(x_label)
            ax.set_ylabel(y_label)
            ax.grid(True, alpha=0.3)
            ax.legend()
    fig.suptitle(f"{workload}: rlhfkit vs TRL, 16 completions per step, shared 2-core CPU (timings noisy)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default=str(HERE / "large_vocab"))
    args = parser.parse_args()
    folder = Path(args.folder)
    runs = load(folder)
    rows = points(runs)
    keys = ("commit", "command", "date", "complete", "steps", "warmup")
    sources = {
        p.name: {k: json.loads(p.read_text())["info"].get(k) for k in keys}
        for p in sorted(folder.glob("results-*.json"))
    }
    text = markdown(rows, sources)
    for workload in sorted({r["workload"] for r in rows}):
        png = HERE / f"scaling-{workload.removesuffix('-lv')}.png"
        if plot(rows, workload, png):
            alt = f"{workload}: loop memory and seconds per step against length and vocabulary"
            text += f"\n![{alt}]({png.name})\n"
    (folder / "TABLES.md").write_text(text)  # included in RESULTS.md, whose folder holds the PNGs
    print(text)


if __name__ == "__main__":
    main()
