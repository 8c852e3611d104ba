"""Building is deterministic, cached, versioned and safe when several processes race."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
from safetensors.torch import load_file

import rlhfkit.testing.models as models_module
from rlhfkit.testing import (
    FORMAT_VERSION,
    TINY_MODEL_NAMES,
    cache_root,
    tiny_model_path,
    tiny_tokenizer_path,
)
from rlhfkit.testing.cache import publish_once


def test_cache_root_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env" / f"tiny-models-v{FORMAT_VERSION}"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg" / f"tiny-models-v{FORMAT_VERSION}"
    monkeypatch.delenv("RLHFKIT_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "rlhfkit" / f"tiny-models-v{FORMAT_VERSION}"


def test_two_builds_are_identical(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    tok_a, tok_b = tiny_tokenizer_path(a), tiny_tokenizer_path(b)
    assert (tok_a / "tokenizer.json").read_bytes() == (tok_b / "tokenizer.json").read_bytes()
    for name in TINY_MODEL_NAMES:
        pa, pb = tiny_model_path(name, a), tiny_model_path(name, b)
        assert pa != pb
        wa, wb = load_file(pa / "model.safetensors"), load_file(pb / "model.safetensors")
        assert wa.keys() == wb.keys()
        for key in wa:
            assert wa[key].equal(wb[key]), f"{name}: {key} differs between builds"
        for fname in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            assert (pa / fname).read_bytes() == (pb / fname).read_bytes(), f"{name}: {fname}"
    # the seeded build left no temp folders behind
    assert not [p for p in cache_root(a).iterdir() if p.name.startswith(".")]


def test_build_does_not_touch_the_global_rng(tmp_path):
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_model_path("llama", tmp_path)
    assert torch.rand(3).equal(expected)


def test_cache_hit_does_not_rebuild(tmp_path, monkeypatch):
    path = tiny_model_path("gpt2", tmp_path)
    weights = path / "model.safetensors"
    before = (weights.stat().st_mtime_ns, weights.stat().st_ino)
    tok_before = (tiny_tokenizer_path(tmp_path) / "tokenizer.json").stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("cache hit must not build anything")

    monkeypatch.setattr(models_module, "_build_model", fail)
    monkeypatch.setattr("rlhfkit.testing.tokenizer._build_tokenizer", fail)
    assert tiny_model_path("gpt2", tmp_path) == path
    assert (weights.stat().st_mtime_ns, weights.stat().st_ino) == before
    assert (tiny_tokenizer_path(tmp_path) / "tokenizer.json").stat().st_mtime_ns == tok_before


def test_publish_once_race_keeps_the_first_copy(tmp_path):
    # Two builders run at the same time; both finish, only one folder is published, the other
    # is discarded, and both callers get the same complete folder.
    final = tmp_path / "thing"
    started = threading.Barrier(2)
    calls = []

    def build(out):
        started.wait(timeout=10)
        calls.append(out)
        (out / "data.txt").write_text(f"built in {out.name}")
        time.sleep(0.05)
        (out / "done").write_text("")

    results = [None, None]

    def worker(i):
        results[i] = publish_once(final, "done", build)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 2 and results == [final, final]
    assert (final / "done").is_file() and (final / "data.txt").read_text().startswith("built in .thing.tmp-")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thing"]  # temp folders cleaned up


def test_publish_once_failed_build_leaves_nothing(tmp_path):
    def broken(out):
        (out / "half").write_text("")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        publish_once(tmp_path / "x", "done", broken)
    with pytest.raises(RuntimeError, match="did not write done"):
        publish_once(tmp_path / "x", "done", lambda out: None)
    assert list(tmp_path.iterdir()) == []


def _build_in_subprocess(cache_dir, barrier, queue):
    barrier.wait(timeout=60)  # start together so the builds really overlap
    queue.put(str(tiny_model_path("qwen2", cache_dir)))


@pytest.mark.slow
def test_concurrent_processes_share_one_build(tmp_path):
    # fork: the children inherit the imported libraries, so the race itself is what takes time
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_build_in_subprocess, args=(str(tmp_path), barrier, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    paths = {queue.get(timeout=5) for _ in procs}
    assert paths == {str(cache_root(tmp_path) / "qwen2")}
    assert sorted(p.name for p in cache_root(tmp_path).iterdir()) == ["qwen2", "tokenizer"]
    assert load_file(cache_root(tmp_path) / "qwen2" / "model.safetensors")  # complete, readable weights
