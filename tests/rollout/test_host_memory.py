import sys
from pathlib import Path

import pytest
import torch

from rlhfkit.rollout import host_memory

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
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert host_memory.fix_mmap_threshold() is False
    assert host_memory._applied is False
