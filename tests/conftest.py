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
def _seed_everything():
    torch.manual_seed(0)
    yield
