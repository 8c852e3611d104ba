"""Shared test configuration: offline, deterministic, small thread count."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

import pytest  # noqa: E402
import torch  # noqa: E402

# The tiny test models are faster on one thread: thread sync costs more than it saves at these sizes.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_thread():
    """One thread per test, restored afterwards: code under test may change the count (the benchmark
    harness pins 2), and on shared CI cores a second thread mostly waits on the first at these sizes."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _no_leaked_tensorboard_dir(monkeypatch):
    """A removed `logging_dir=` argument sets TENSORBOARD_LOGGING_DIR for the process; undo it after each
    test, or every later TensorBoard run would write into that test's temporary folder."""
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
