"""What the vLLM server adds to each of its engine's workers: reloading the weights from files.

vLLM mixes this class into its worker class (the engine's `worker_extension_cls`), so
`LLM.collective_rpc("rlhfkit_load_weights", args=(paths,))` runs the method in every worker process.
The weights travel as safetensors files rather than through vLLM's GPU weight-transfer engine
(NCCL/IPC): that works on any device, CPU included. They go through the worker's `reload_weights`,
not the model's bare `load_weights`: on CPU the engine repacks linear weights after loading (the
loaded parameter is emptied), and the reload path undoes and redoes that. Each worker reads every
tensor and the model's loader takes the slice it holds (tensor parallelism), under the names of a
transformers checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator


def _tensors(paths: list[str]) -> Iterator[tuple[str, object]]:
    """(name, tensor) of every tensor of the safetensors files `paths`, one tensor in memory at a time."""
    from safetensors import safe_open

    for path in paths:
        with safe_open(path, framework="pt") as file:
            for name in file.keys():
                yield name, file.get_tensor(name)


class WeightLoadingExtension:
    """Worker methods callable through `collective_rpc`; the names are prefixed to avoid vLLM's own."""

    def rlhfkit_load_weights(self, paths: list[str]) -> None:
        """Reload the model's weights (all or some of them) from safetensors files `paths`."""
        self.reload_weights(weights_iterator=_tensors(paths))
