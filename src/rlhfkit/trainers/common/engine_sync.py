"""An inference engine (use_vllm) shared by the training processes: who sends it weights, and when.

As in TRL's server mode, every process samples its own prompts on the one server, and after each
optimizer step the main process alone sends the new weights while the others wait at a barrier, so that
no process samples from weights the server is still loading. A colocated engine lives inside one
process and stays one-process. Under ZeRO-3 the sync gathers the policy one module at a time.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from rlhfkit.trainers.common.sharding import module_gatherer


def engine_options(
    engine: str, options: dict[str, Any], accelerator: Any, tokenizer: Any = None
) -> dict[str, Any]:
    """`options` for `make_generation_backend` in this process; ValueError for a colocated engine under
    several processes. A colocated engine constraining completions to a regex gets the `tokenizer` (a
    server has its own)."""
    if engine != "vllm-server":
        if accelerator.num_processes > 1:
            raise ValueError(
                f"use_vllm ({engine}) runs with one training process; with {accelerator.num_processes}, use "
                "vllm_mode='server' (every process samples on the server, the main one sends the weights)"
            )
        if options.get("structured_outputs_regex") is not None:
            return {**options, "tokenizer": tokenizer}
        return options
    return {
        **options,
        "sends_weights": bool(accelerator.is_main_process),
        "gather_module": module_gatherer(accelerator),
    }


def sync_engine(engine: Any, model: nn.Module, accelerator: Any) -> None:
    """Give `engine` the weights of `model` (sent by the main process), then wait for every process."""
    engine.sync_weights(model)
    accelerator.wait_for_everyone()
