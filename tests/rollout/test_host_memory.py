import sys
from pathlib import Path

import pytest
import torch

from rlhfkit.rollout import host_memory
from rlhfkit.testing import tiny_model

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


@linux
def test_freed_large_blocks_go_back_to_the_os():
    if not host_memory.fix_mmap_threshold():
        pytest.skip("not glibc")
    assert host_memory.fix_mmap_threshold() is True  # once per process, then remembered
    before = _rss_mb()
    kept = []
    for _ in range(30):  # a chunk-sized block per step, small long-lived ones in between
        block = torch.ones(16, 330_000)  # 21 MB, above the pinned threshold
        kept.append(block[:, :1].clone())
        del block
    assert _rss_mb() - before < 20


def test_user_setting_is_left_alone(monkeypatch):
    monkeypatch.setattr(host_memory, "_applied", None)
    monkeypatch.setattr(host_memory, "_libc", host_memory._libc)  # restored after the test with _applied
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert host_memory.fix_mmap_threshold() is False
    assert host_memory._applied is False


@linux
def test_release_free_heap_returns_freed_small_blocks():
    if not host_memory.fix_mmap_threshold():
        pytest.skip("not glibc")
    model = tiny_model("llama")  # vocabulary of 1,000: 1,049 rows make a 4 MiB float32 block
    blocks = [torch.ones(16, 150_000) for _ in range(8)]  # 9.6 MB each: below the threshold, from the heap
    kept = torch.ones(1)  # allocated after them: the heap cannot shrink from its top
    high = _rss_mb()
    del blocks
    assert not host_memory.release_free_heap(
        model, rows=1048
    )  # too small to be worth a trim: nothing happens
    assert not host_memory.release_free_heap(torch.nn.Linear(2, 2), rows=10**6)  # not a generation model
    assert host_memory.release_free_heap(model, rows=1049)
    assert high - _rss_mb() > 40  # most of the 77 MB went back although it sits below `kept`
    assert kept.item() == 1.0


def test_trim_heap_only_for_blocks_worth_it(monkeypatch):
    calls = []

    class FakeLibc:
        def malloc_trim(self, pad):
            calls.append(pad)

    monkeypatch.setattr(host_memory, "_libc", FakeLibc())
    assert not host_memory.trim_heap(host_memory.TRIM_MIN_BLOCK_BYTES - 1)
    assert host_memory.trim_heap(host_memory.TRIM_MIN_BLOCK_BYTES) and calls == [0]
    monkeypatch.setattr(host_memory, "_libc", None)  # threshold not pinned (or not glibc): never
    assert not host_memory.trim_heap(10**9) and calls == [0]
