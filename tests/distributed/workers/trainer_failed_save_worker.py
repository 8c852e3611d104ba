"""Worker: an SFT Trainer run on 2 gloo processes whose second checkpoint fails on rank 1 only.

Rank 1's random-state file (each process writes its own into the checkpoint) raises OSError at step 2, while
rank 0 is still writing its own.
The collective timeout is 60 s: a process left waiting at a barrier would fail with a timeout instead of
the checkpoint error each result records.
"""

import os
import time
from pathlib import Path

from hf_fixtures import build
from launch import save_result

out = Path(os.environ["RLHFKIT_DIST_OUT"]) / "run"  # one output folder for both ranks, like a real run
trainer = build("sft", str(out), per_device=2, save_strategy="steps", save_steps=1, ddp_timeout=60)
rank, original = trainer.args.process_index, trainer._save_rng_state


def failing_rng_state(output_dir):
    if rank == 1 and trainer.state.global_step == 2:
        raise OSError(5, "disk error on process 1")
    if rank == 0 and trainer.state.global_step == 2:
        time.sleep(2)  # rank 1 fails first: it must not delete the folder rank 0 is still writing in
    return original(output_dir)


trainer._save_rng_state = failing_rng_state
try:
    trainer.train()
    result = {"type": None, "message": ""}
except Exception as err:  # the test checks which error each process raised
    result = {"type": type(err).__name__, "message": str(err)}
result["listing"] = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
save_result(result)
