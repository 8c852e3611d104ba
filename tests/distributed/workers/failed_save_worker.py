"""Worker: `save_training_checkpoint` on 2 gloo processes where one process's part of the save fails.

Into the folder given as the first argument: `checkpoint-1` is saved by both; then a save fails in each of its
phases: rank 0's first write (weights and state), rank 1's write of its random state, rank 0's manifest just
before publishing (each an OSError); then `checkpoint-5` is saved normally. The
collective timeout is short (60 s): a process left waiting for the other would fail with a timeout instead of
the checkpoint error each result records.
"""

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from launch import save_result

import rlhfkit.trainers.common.checkpointing as checkpointing

folder = Path(sys.argv[1])
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
checkpointing.save_training_checkpoint(folder / "checkpoint-1", 1, model, {})


def fail(*args, **kwargs):
    raise OSError(5, f"disk error on process {rank}")


def failing_save(step: int, failing_rank: int, target: str) -> dict:
    """Save `checkpoint-<step>` with `checkpointing.<target>` raising on `failing_rank`; what this
    process saw."""
    original = getattr(checkpointing, target)
    if rank == failing_rank:
        setattr(checkpointing, target, fail)
    try:
        checkpointing.save_training_checkpoint(folder / f"checkpoint-{step}", step, model, {})
    except Exception as err:  # the test checks which error each process raised
        return {"type": type(err).__name__, "message": str(err)}
    finally:
        setattr(checkpointing, target, original)
    return {"type": None, "message": ""}


with torch.no_grad():
    model.weight.add_(1.0)  # the failed saves would hold other weights than checkpoint-1
results = {
    "start": failing_save(2, 0, "save_state"),
    "add": failing_save(3, 1, "save_state"),
    "publish": failing_save(4, 0, "write_manifest"),
}
checkpointing.save_training_checkpoint(
    folder / "checkpoint-5", 5, model, {}
)  # the processes still work together
save_result(results)
