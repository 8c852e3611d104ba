"""The large-vocabulary side of the benchmark harness (issue 16): run points, the memory watchdog, the
per-pair ratios and OOM verdicts of scaling.py, and the models prepare.py builds. Nothing is timed here."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_lv_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


@pytest.fixture(scope="module")
def run_module():
    return _load("run")


def test_lengths_apply_to_the_large_vocabulary_workloads_only(run_module):
    args = run_module.parse_args(["--workloads", "ppo,ppo-lv,dpo-lv", "--models", "tiny,v152k", "--lengths", "256,1024"])
    points = [(m, n, w.name) for m, n, w in run_module._points(args, [run_module.WORKLOADS[w] for w in args.workloads])]
    # tiny runs only the classic workload (no length); v152k runs both lv workloads at each length, grouped by length
    assert points == [("tiny", None, "ppo"), ("v152k", 256, "ppo-lv"), ("v152k", 256, "dpo-lv"),
                      ("v152k", 1024, "ppo-lv"), ("v152k", 1024, "dpo-lv")]
    default = run_module.parse_args(["--workloads", "rloo-lv", "--models", "v1k"])
    assert [n for _, n, _ in run_module._points(default, [run_module.WORKLOADS["rloo-lv"]])] == [256]
    with pytest.raises(SystemExit):
        run_module.parse_args(["--lengths", "256,x"])


def test_watchdog_stops_a_child_past_its_memory_limit(run_module):
    # 600 MiB written (so resident), then a long sleep: the watchdog must stop it well before the timeout
    proc = subprocess.Popen([sys.executable, "-c", "import time; x = b'x' * (600 * 2**20); time.sleep(60)"])
    try:
        with pytest.raises(MemoryError, match="resident memory reached"):
            run_module._wait4(proc, timeout=50, max_rss_gb=0.25)
    finally:
        proc.kill()
        proc.wait()
    quiet = subprocess.Popen([sys.executable, "-c", "pass"])
    _, status, _ = run_module._wait4(quiet, timeout=50, max_rss_gb=0.25)
    assert status == 0


def _run(library, length, eps, rss, repeat=0, **extra):
    return {"library": library, "workload": "ppo-lv", "model": "v152k", "length": length, "repeat": repeat,
            "seconds_per_step": 16 / eps, "episodes_per_second": eps, "tokens_per_second": 1.0, "peak_rss_mb": rss,
            "os_peak_rss_mb": rss, "process_cpu_seconds": 1.0, **extra}


def test_summary_keeps_lengths_apart_with_loop_memory_ratio(run_module, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    runs = [_run("rlhfkit", 256, 2.0, 1400), _run("trl", 256, 1.0, 3400), _run("rlhfkit", 1024, 1.0, 2400)]
    runs.append({"library": "trl", "workload": "ppo-lv", "model": "v152k", "length": 1024, "error": "out of memory"})
    rows = run_module.summarize(runs, {"models": {}}, {}, {"rlhfkit/ppo-lv": 400.0, "trl/ppo-lv": 400.0})
    short, long = rows
    assert (short["length"], long["length"]) == (256, 1024)
    assert short["loop_memory_ratio"] == pytest.approx(1000 / 3000)  # peaks above the import baselines
    assert short["speed_ratio"] == pytest.approx(2.0)
    assert long["trl_error"] == "out of memory" and "speed_ratio" not in long
    assert run_module._label(long) == "v152k @1024"


def test_pairs_give_ratios_and_oom_is_a_verdict(tmp_path):
    scaling = _load("scaling")
    import json

    runs = [_run("rlhfkit", 256, 2.0, 1400, 0), _run("trl", 256, 1.0, 3400, 0),
            _run("trl", 256, 2.0, 3400, 1), _run("rlhfkit", 256, 3.0, 1400, 1),
            _run("rlhfkit", 1024, 1.0, 2400, 0),
            {"library": "trl", "workload": "ppo-lv", "model": "v152k", "length": 1024, "repeat": 0,
             "error": "out of memory", "oom": "resident memory reached 20.1 GiB (limit 20 GiB, ...)"}]
    info = {"commit": "abc", "command": "python benchmarks/run.py ...", "date": "d", "eos": False}
    baselines = {"rlhfkit/ppo-lv": 400.0, "trl/ppo-lv": 400.0}
    (tmp_path / "results-x.json").write_text(json.dumps({"info": info, "import_baselines": baselines, "runs": runs}))
    rows = scaling.points(scaling.load(tmp_path))
    short, long = rows
    assert short["pair_speed_ratios"] == pytest.approx([2.0, 1.5])  # each repeat's pair, not medians of medians
    assert short["loop_memory_ratio"] == pytest.approx(1 / 3)
    assert "speed 1.75x met" in scaling._verdict(short) and "memory 0.33x met" in scaling._verdict(short)
    assert scaling._verdict(long) == "TRL ran out of memory; rlhfkit ran"
    table = scaling.markdown(rows, {"results-x.json": info})
    assert "OOM: resident memory reached 20.1 GiB" in table and "commit abc" in table


def test_word_tokenizer_counts_one_token_per_word():
    prepare = _load("prepare")
    tokenizer = prepare._word_tokenizer(50)
    assert tokenizer.get_vocab_size() == 50
    ids = tokenizer.encode("w2 w49 w7").ids
    assert ids == [2, 49, 7]
    assert tokenizer.decode(ids) == "w2 w49 w7"  # decoding and re-tokenising (TRL 1.16's reward path) round-trips


def test_raised_eos_is_about_one_in_mean_length():
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    prepare = _load("prepare")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, eos_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    prepare._raise_eos(model, 128)
    with torch.no_grad():
        probs = model(input_ids=torch.randint(2, 2000, (4, 64))).logits.softmax(-1)[..., 0]
    assert 1 / 512 < probs.mean().item() < 1 / 32  # about 1/128 (context moves it), far above uniform's 1/2000
