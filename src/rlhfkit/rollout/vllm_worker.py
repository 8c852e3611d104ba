"""What rlhfkit runs on a vLLM engine's worker: reloading the weights, from files or from memory.

vLLM mixes this class into its worker class (the engine's `worker_extension_cls`), so
`LLM.collective_rpc("rlhfkit_load_weights", args=(paths,))` runs the method in every worker process.
The weights travel as safetensors files rather than through vLLM's GPU weight-transfer engine
(NCCL/IPC): that works on any device, CPU included. They go through the worker's `reload_weights`,
not the model's bare `load_weights`: on CPU the engine repacks linear weights after loading (the
loaded parameter is emptied), and the reload path undoes and redoes that. Each worker reads every
tensor and the model's loader takes the slice it holds (tensor parallelism), under the names of a
transformers checkpoint.

A tied output layer (an lm_head sharing the input embedding, as Qwen2.5's) is loaded through the
embedding only, so the reload path does not redo what the engine derived from it after loading (on
CPU, a packed copy the logits are computed with): `reload_weights` redoes it for every tied layer, else
the engine would keep sampling with the old output layer. The colocate backend calls it in-process.
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


def reload_weights(worker: object, weights: Iterator[tuple[str, object]]) -> None:
    """Load (name, tensor) `weights` into `worker`'s model in place, tied layers refreshed."""
    worker.reload_weights(weights_iterator=weights)
    _refresh_tied_layers(worker.model_runner.model)


def _refresh_tied_layers(net) -> None:
    """Redo the after-loading step of every layer whose weight another layer shares (e.g. a tied lm_head)."""
    owners: dict[int, list] = {}
    for module in net.modules():
        weight = module._parameters.get("weight")
        if weight is not None:
            owners.setdefault(id(weight), []).append(module)
    for modules in owners.values():
        for module in modules if len(modules) > 1 else ():
            method = getattr(module, "quant_method", None)
            if method is not None:
                method.process_weights_after_loading(module)


class WeightLoadingExtension:
    """Worker methods callable through `collective_rpc`; the names are prefixed to avoid vLLM's own."""

    def rlhfkit_load_weights(self, paths: list[str]) -> None:
        """Reload the model's weights (all or some of them) from safetensors files `paths`."""
        reload_weights(self, _tensors(paths))
