"""The measured figures in README.md and docs/ say exactly what the committed result files say.

Fails when a `<!-- results:NAME -->` block differs from what `scripts/render_results.py` renders from
its result file (fix: `make results`, or re-measure with the file's command), or when a result file
does not name the commit and command it came from.
"""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _script("render_results")


@pytest.mark.parametrize("page", render.pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_marked_blocks_match_the_result_files(page):
    text = page.read_text("utf-8")
    rendered, _ = render.render_page(text)
    assert rendered == text, f"{page.relative_to(ROOT)} is stale: run `make results`"


def test_every_block_is_on_a_page():
    seen = set()
    for page in render.pages():
        seen.update(render.render_page(page.read_text("utf-8"))[1])
    assert seen == set(render.SOURCES)


def test_every_result_file_names_commit_and_command():
    paths = {p for make_paths, _ in render.SOURCES.values() for p in make_paths()}
    paths |= {str(p.relative_to(ROOT)) for p in (ROOT / "results").glob("*.json")}
    assert "results/demo-rloo.json" in paths
    for path in sorted(paths):
        _, data = render.load(path)
        assert render.commit_of(data) and data["command"], path


def test_result_file_without_commit_is_refused(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"command": "python bench.py", "results": []}))
    with pytest.raises(ValueError, match="lacks commit"):
        render.load(str(path))  # an absolute path: ROOT / path is path itself
    path.write_text(json.dumps({"git_commit": "0123456789abcdef0123", "results": []}))
    with pytest.raises(ValueError, match="lacks command"):
        render.load(str(path))


def test_commit_is_shortened_and_keeps_dirty():
    assert (
        render.commit_of({"git_commit": "e48664de2a108dacbbd2c96896ba677e84ed9c83-dirty"})
        == "e48664de2a10-dirty"
    )
    assert render.commit_of({"commit": "36442f7"}) == "36442f7"


def test_stale_block_is_rewritten_and_unknown_block_refused():
    page = (
        "intro\n<!-- results:padding-free -->\nthe old figure: 9.99x\n<!-- /results:padding-free -->\nrest\n"
    )
    rendered, names = render.render_page(page)
    assert names == ["padding-free"]
    assert "9.99x" not in rendered and rendered.startswith("intro\n") and rendered.endswith("\nrest\n")
    assert "Source: `benchmarks/padding_free.json` (commit `" in rendered
    assert render.render_page(rendered)[0] == rendered  # rendering twice changes nothing
    with pytest.raises(KeyError, match="no-such-block"):
        render.render_page("<!-- results:no-such-block -->\n<!-- /results:no-such-block -->")


def test_padding_free_figures_are_computed_from_the_file():
    data = {
        "command": "python bench.py", "threads": 2, "note": "quiet", "rows": 4, "repeats": 3,
        "model": "rlhfkit.testing llama",
        "real_tokens": 75, "padded_tokens": 100,
        "results": [
            {"variant": "padded", "median_seconds": 1.2, "loss": 1.0, "grad_norm": 2.0},
            {"variant": "packed", "median_seconds": 0.6, "loss": 1.0, "grad_norm": 2.0},
        ],
    }  # fmt: skip
    (line,) = render.render_padding_free([("x.json", data)])
    # 1 - 75/100 = 25% padding; 1.2 / 0.6 = 2.00x
    assert "with 25% padding took 1.20 s padded and 0.60 s packed (2.00x, medians of 3)" in line
    assert "the same loss" in line and "with 2 CPU threads (quiet), 4 rows" in line


def test_demo_comparison_names_the_stages_each_run_reused():
    def record(algo, reward_hash):
        stages = {name: {"config_hash": "h"} for name in ("sft", "preferences")}
        stages["reward"] = {"config_hash": reward_hash}
        stages["rl"] = {"reused": False, "seconds": 65.4}
        evaluation = {"win_rate_rl_vs_sft": 0.805, "win_rate_ci95": [0.76, 0.85], "gold_score_rl": 0.5}
        evaluation["kl_rl_to_sft"] = 4.86
        metrics = {"config": {"algo": algo}, "evaluation": evaluation, "stages": stages}
        return f"results/demo-{algo}.json", {"metrics": metrics}

    lines = render.render_demo_algos([record("rloo", "r"), record("ppo-multi-adapter", "adapter")])
    assert lines[2] == "| `rloo` | 80.5% (76.0-85.0%) | not recorded | 0.500 | 4.86 | 1 min 5 s | (itself) |"
    assert lines[3].endswith("| SFT, preference pairs; its own reward model |")
    assert "Only the default" in render.render_demo_algos([record("rloo", "r")])[0]


def test_recorder_writes_commit_command_and_machine(tmp_path):
    record = _script("record_demo_result")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(
        json.dumps({"config": {"algo": "dpo", "num_threads": 1}, "evaluation": {}})
    )
    argv = ["--algo", "dpo", "--no-run", "--output_dir", str(run), "--results", str(tmp_path / "results")]
    assert record.main(argv) == 0
    data = json.loads((tmp_path / "results" / "demo-dpo.json").read_text())
    assert data["command"] == f"rlhfkit demo --algo dpo --output_dir {run}"
    assert render.commit_of(data) == data["commit"] and len(data["commit"].split("-")[0]) == 12
    assert data["machine"]["torch_threads"] == 1 and data["machine"]["load_average_before"] is None
    assert data["metrics"]["config"]["algo"] == "dpo"
    with pytest.raises(SystemExit):  # the folder holds a dpo run, not an rloo one
        record.main(["--algo", "rloo", "--no-run", "--output_dir", str(run), "--results", str(tmp_path)])


def test_second_judge_and_curve_end_render_or_say_not_recorded():
    ev = {"win_rate_rl_vs_sft_classifier": 0.625, "win_rate_classifier_ci95": [0.2194, 0.9081]}
    assert render.second_judge_cell(ev) == "62.5% (95% CI 21.9-90.8%)"
    assert (
        render.second_judge_cell({"win_rate_rl_vs_sft": 0.8}) == "not recorded"
    )  # a file from before the judge
    assert render.curve_end_text({"curve_win_rate_end": 0.75, "curve_step_end": 40}) == "75.0% at update 40"
    assert render.curve_end_text({"updates": 40}) == "not recorded"


def test_recorder_takes_a_verifiable_task(tmp_path):
    record = _script("record_demo_result")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(
        json.dumps({"config": {"task": "addition", "algo": "rloo"}, "evaluation": {}})
    )
    argv = [
        "--task",
        "addition",
        "--no-run",
        "--output_dir",
        str(run),
        "--results",
        str(tmp_path / "results"),
    ]
    assert record.main(argv) == 0
    data = json.loads((tmp_path / "results" / "demo-addition.json").read_text())
    assert data["command"] == f"rlhfkit demo --task addition --output_dir {run}"
    with pytest.raises(SystemExit):  # a sentiment record asked of an addition run
        record.main(["--algo", "rloo", "--no-run", "--output_dir", str(run), "--results", str(tmp_path)])


def test_verifiable_task_block_is_computed_from_the_file():
    stages = {
        "base": {"seconds": 1.0, "reused": False},
        "sft": {"seconds": 30.0, "reused": False, "summary": {"steps": 300, "train_probe_accuracy": 0.45}},
        "rl": {
            "seconds": 75.0,
            "reused": False,
            "summary": {"steps": 150, "reward_start": 0.25, "reward_end": 0.5},
        },
        "evaluation": {"seconds": 4.0, "reused": True},
    }
    ev = {
        "num_prompts": 1600, "greedy_sft": 0.5, "greedy_sft_ci95": [0.4755, 0.5246], "sampled_sft": 0.4,
        "greedy_rl": 0.74, "greedy_rl_ci95": [0.7179, 0.761], "sampled_rl": 0.6, "lift_points": 24.0,
    }  # fmt: skip
    cfg = {"seed": 0, "size": "default", "rl_batch_size": 256, "num_generations": 8, "temperature": 0.4}
    data = {
        "command": "rlhfkit demo --task addition",
        "date": "today",
        "machine": {"cores": 2, "cpu": "cpu", "note": "quiet", "load_average_after": [1.0]},
        "metrics": {"config": cfg, "evaluation": ev, "stages": stages, "total_seconds": 125},
    }
    lines = render.render_verifiable_task([("results/demo-addition.json", data)])
    assert "**2 min 5 s**" in lines[0] and "SFT 30 s, GRPO 1 min 15 s, evaluation reused" in lines[0]
    assert "150 steps of 32 prompts x 8 completions at temperature 0.4" in lines[0]  # 256 / 8 = 32
    assert lines[4] == "| SFT warm start | 50.0% | 47.5-52.5% | 40.0% |"
    assert lines[5] == "| GRPO, 150 steps | 74.0% | 71.8-76.1% | 60.0% |"
    assert lines[-1].endswith("**+24.0 points** (issue 17 asks for +25: missed).")


def test_agent_task_block_is_computed_from_the_file():
    stages = {
        "base": {"seconds": 1.0, "reused": False},
        "sft": {"seconds": 55.0, "reused": False, "summary": {"steps": 140, "train_probe_accuracy": 0.32}},
        "rl": {
            "seconds": 87.0,
            "reused": True,
            "summary": {"steps": 60, "reward_start": 0.39, "reward_end": 0.53},
        },
        "evaluation": {"seconds": 4.0, "reused": False},
    }
    ev = {"num_prompts": 512, "lift_points": 27.5}
    for name, (no_tools, greedy) in {"sft": (0.0, 0.25), "rl": (0.0, 0.525)}.items():
        ev.update({f"no_tools_{name}": no_tools, f"no_tools_{name}_ci95": [0.0, 0.0074]})
        ev.update({f"greedy_{name}": greedy, f"greedy_{name}_ci95": [greedy - 0.04, greedy + 0.04]})
        ev.update({f"tool_use_{name}": 1.0, f"wrong_call_{name}": 0.2, f"misread_result_{name}": 0.125})
    cfg = {"seed": 0, "size": "default", "rl_batch_size": 128, "num_generations": 8, "temperature": 0.4}
    data = {
        "command": "rlhfkit demo --task calculator",
        "date": "today",
        "machine": {"cores": 2, "cpu": "cpu", "note": "quiet", "load_average_after": [1.0]},
        "metrics": {"config": cfg, "evaluation": ev, "stages": stages, "total_seconds": 147},
    }
    lines = render.render_agent_task([("results/demo-calculator.json", data)])
    assert "**2 min 27 s**" in lines[0] and "SFT 55 s, GRPO reused, evaluation 4 s" in lines[0]
    assert "60 steps of 16 prompts x 8 episodes at temperature 0.4" in lines[0]  # 128 / 8 = 16
    assert (
        lines[4] == "| SFT warm start | 0.0% (0.0-0.7%) | **25.0% (21.0-29.0%)** | 100.0% | 20.0% | 12.5% |"
    )
    assert (
        lines[5] == "| GRPO, 60 steps | 0.0% (0.0-0.7%) | **52.5% (48.5-56.5%)** | 100.0% | 20.0% | 12.5% |"
    )
    assert lines[-1].endswith("**+27.5 points** (issue 35 asks for +25: met).")


def test_agent_task_seeds_block_has_a_row_per_seed_file():
    def record(seed, probe, sft, rl, lift, seconds):
        ev = {"greedy_sft": sft, "greedy_rl": rl, "lift_points": lift}
        stages = {"sft": {"summary": {"steps": 130, "train_probe_accuracy": probe}}}
        metrics = {"config": {"seed": seed}, "evaluation": ev, "stages": stages, "total_seconds": seconds}
        return f"results/demo-calculator-seed{seed}.json", {"metrics": metrics}

    lines = render.render_agent_task_seeds(
        [record(0, 0.25, 0.2, 0.5, 30.0, 150), record(2, 0.34, 0.4, 0.6, 20.0, 61)]
    )
    assert lines[2] == "| 0 | step 130 (25.0%) | 20.0% | 50.0% | +30.0 | met | 2 min 30 s |"
    assert lines[3] == "| 2 | step 130 (34.0%) | 40.0% | 60.0% | +20.0 | missed | 1 min 1 s |"  # 61 s


def test_calculator_seed_files_follow_the_record_and_sort_by_seed(tmp_path, monkeypatch):
    for seed in (10, 2, 1):
        (tmp_path / "results").mkdir(exist_ok=True)
        (tmp_path / "results" / f"demo-calculator-seed{seed}.json").write_text("{}")
    monkeypatch.setattr(render, "ROOT", tmp_path)
    assert render.calculator_seed_records() == [
        "results/demo-calculator.json",
        *(f"results/demo-calculator-seed{seed}.json" for seed in (1, 2, 10)),  # 10 after 2: by number
    ]


def test_recorder_names_a_file_per_seed():
    record = _script("record_demo_result")
    assert record.record_name("rloo", "calculator", ["--seed", "2"]) == "calculator-seed2"
    assert record.record_name("rloo", "calculator", ["--seed=1", "--rl_updates", "5"]) == "calculator-seed1"
    assert record.record_name("rloo", "calculator", ["--seed", "0"]) == "calculator"  # seed 0: the record
    assert record.record_name("dpo", "sentiment", []) == "dpo"
