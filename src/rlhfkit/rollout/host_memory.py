"""Keep glibc from hoarding the large blocks that sampling and chunked log-probabilities free.

glibc's malloc serves blocks above a threshold (128 KiB at start) with their own mmap and returns them to
the OS on free; but each such free raises the threshold to the freed size (up to 32 MiB), after which blocks
of that size are carved from the heap, where smaller long-lived allocations made in between pin the freed
space. At a 152k vocabulary the lm-head chunks of training (then 32 MiB each, `core/chunked_logprobs.py`)
stayed resident (+320 MiB per RLOO micro-batch instead of +142), and sampling, while it kept a fresh
log-softmax row per step, left the process 1.3 GB larger (measured with benchmarks/rss_trace.py).
Fixing the threshold (`mallopt(M_MMAP_THRESHOLD)`) at 16 MiB turns that adjustment off: chunk-sized blocks
always go back to the OS, while smaller per-step blocks of sampling ((16, 151,936) float32 is 9.7 MB) are
reused from the heap without fresh page faults (pinning at 128 KiB
cost PPO up to a quarter more CPU per step, one pair each at 64 to 256 tokens).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

import torch

from rlhfkit.rollout.streaming import generating_module

logger = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 16 * 2**20
TRIM_MIN_BLOCK_BYTES = 4 * 2**20  # below it, release_free_heap leaves the heap alone
_ENV = "MALLOC_MMAP_THRESHOLD_"  # glibc's own setting: when the user chose one, leave it
_applied: bool | None = None
_libc: ctypes.CDLL | None = None  # glibc, once the threshold is pinned


def fix_mmap_threshold() -> bool:
    """Pin glibc's mmap threshold at 16 MiB, once per process; True when it is pinned (now or before).

    A no-op (False) off Linux/glibc or when the environment already sets MALLOC_MMAP_THRESHOLD_.
    """
    global _applied, _libc
    if _applied is not None:
        return _applied
    _applied, _libc = False, None
    if not sys.platform.startswith("linux") or _ENV in os.environ:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")  # find_library runs ldconfig: once
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    _libc = libc if _applied else None
    if _applied:
        logger.info(
            "glibc mmap threshold fixed at %d bytes (freed large blocks go back to the OS)",
            MMAP_THRESHOLD_BYTES,
        )
    return _applied


def release_free_heap(model: torch.nn.Module, rows: int) -> bool:
    """Hand the heap's free pages back to the OS (glibc `malloc_trim`) after `model` sampled `rows` rows;
    True when it did. A no-op where `fix_mmap_threshold` did not pin, and when a (rows, vocab) float32
    block is under 4 MiB: sampling then leaves little heap behind, and the pages handed back are faulted in
    again the next step (GRPO, 256 rows of a 1k vocabulary: 15% more CPU per step with a trim each step)."""
    if _libc is None:
        return False
    try:
        vocab = getattr(generating_module(model).config, "vocab_size", None) or 0
    except ValueError:  # no transformers generation model inside: the block cannot be sized, leave the heap
        return False
    return trim_heap(rows * vocab * 4)


def trim_heap(block_bytes: int) -> bool:
    """`malloc_trim` when the work just done moved float blocks of `block_bytes` (at least 4 MiB) and
    `fix_mmap_threshold` pinned the threshold; True when it trimmed."""
    if _libc is None or block_bytes < TRIM_MIN_BLOCK_BYTES:
        return False
    _libc.malloc_trim(0)
    return True
