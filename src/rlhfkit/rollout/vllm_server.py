"""The vLLM engine behind `rlhfkit vllm-serve`, and the HTTP API trainers sample through.

Runs in the server's own venv (`make vllm-env`: vLLM pins an older transformers than the trainer's),
so it imports vLLM freely; the trainer side (`vllm_client.py`) needs only HTTP. Endpoints, all JSON
except the weights:

- `GET /health/`: 200 once the engine is up.
- `GET /info/`: what is served (model, architecture, vocabulary size, max model length, vLLM version),
  for the client to check against the trainer's model before training starts.
- `POST /generate/`: prompt token ids (no padding) and sampling settings in (a `regex` constrains the
  completions: vLLM's structured outputs, with the served model's tokenizer); per prompt the completion
  token ids (the stop token kept) and, when asked, the logprob of each sampled token out.
- `POST /update_weights/?last=true|false`: a safetensors file as the request body, tensors under
  transformers checkpoint names. Pieces with `last=false` are kept on disk; the last one reloads the
  model from all of them in every worker (`vllm_worker.py`) and resets the prefix cache, whose keys and
  values were computed with the old weights.

The engine reports the logprobs of the distribution it sampled from (`logprobs_mode=
"processed_logprobs"`: after temperature, penalties and top-k/top-p), as TRL's server does. One
request runs at a time: `LLM` is not thread-safe, and it batches each request's prompts itself.
"""

# no `from __future__ import annotations`: FastAPI reads the endpoints' annotations at runtime
import json
import logging
import tempfile
import threading
from pathlib import Path
from typing import Any

from rlhfkit.rollout import vllm_common

logger = logging.getLogger(__name__)

API_VERSION = 1


def require_vllm() -> str:
    """vLLM's version; ImportError naming the fix when it is missing or of an untested version."""
    return vllm_common.require_vllm(
        "rlhfkit vllm-serve", "run the server there: .venv-vllm/bin/rlhfkit vllm-serve --model ..."
    )


def engine_kwargs(args: Any) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments from the command's flags (`VLLMServeArguments`)."""
    kwargs = dict(
        model=args.model,
        revision=args.revision,
        tensor_parallel_size=args.tensor_parallel_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        enforce_eager=args.enforce_eager,
        kv_cache_dtype=args.kv_cache_dtype,
        trust_remote_code=args.trust_remote_code,
        model_impl=args.vllm_model_impl,
        distributed_executor_backend=args.distributed_executor_backend,
        speculative_config=json.loads(args.speculative_config) if args.speculative_config else None,
        logprobs_mode="processed_logprobs",
        worker_extension_cls="rlhfkit.rollout.vllm_worker.WeightLoadingExtension",
    )
    kwargs.update(vllm_common.kv_cache_kwargs(args.kv_cache_memory_gib), **vllm_common.cpu_scheduler_kwargs())
    return {k: v for k, v in kwargs.items() if v is not None}


def checkpoint_shapes(model: str) -> dict[str, list[int]] | None:
    """Name -> shape of every tensor of the safetensors checkpoint in folder `model` (None: not a folder)."""
    from safetensors import safe_open

    files = sorted(Path(model).glob("*.safetensors")) if Path(model).is_dir() else []
    shapes = {}
    for path in files:
        with safe_open(str(path), framework="pt") as file:
            shapes.update({name: list(file.get_slice(name).get_shape()) for name in file.keys()})
    return shapes or None


def unexpected_weights(paths: list[str], expected: dict[str, list[int]] | None) -> list[str]:
    """What in the safetensors files `paths` the served checkpoint has not (names and shapes); [] if fine.

    Checked before the engine reloads: a reload that fails half-way leaves its model unusable.
    """
    from safetensors import safe_open

    if expected is None:
        return []
    problems = []
    for path in paths:
        with safe_open(path, framework="pt") as file:
            for name in file.keys():
                shape = list(file.get_slice(name).get_shape())
                if name not in expected:
                    problems.append(f"{name} (not in the checkpoint)")
                elif shape != expected[name]:
                    problems.append(f"{name} (shape {shape}, the checkpoint's is {expected[name]})")
    return problems


class WeightUpdate:
    """The pieces of one weight update, kept on disk until the last one; then one reload of the engine.

    A reload that fails half-way leaves the engine's model unusable: `broken` then says why, and the
    server reports itself unhealthy.
    """

    def __init__(self, llm: Any, lock: threading.Lock, expected: dict[str, list[int]] | None):
        self.llm, self.lock, self.expected = llm, lock, expected
        self.staged: list[Any] = []
        self.broken: str | None = None

    def add(self, body: bytes, last: bool) -> dict[str, int]:
        """Stage one safetensors piece; the last one reloads. ValueError: a name or shape the model lacks."""
        if not body:
            raise ValueError("the request body must be a safetensors file")
        self.staged.append(tempfile.NamedTemporaryFile(suffix=".safetensors"))
        self.staged[-1].write(body)
        self.staged[-1].flush()
        if not last:
            return {"staged": len(self.staged)}
        files, self.staged = self.staged, []
        paths = [f.name for f in files]
        try:
            problems = unexpected_weights(paths, self.expected)
            if problems:
                raise ValueError(f"could not load the weights, the model has no {'; no '.join(problems[:5])}")
            with self.lock:
                try:
                    self.llm.collective_rpc("rlhfkit_load_weights", args=(paths,))
                    self.llm.reset_prefix_cache()  # its keys and values came from the old weights
                except Exception as err:
                    self.broken = f"a weight update failed half-way ({err}): restart the server"
                    raise RuntimeError(self.broken) from err
        finally:
            for file in files:
                file.close()
        return {"loaded_files": len(files)}


def build_app(llm: Any, info: dict[str, Any], expected: dict[str, list[int]] | None = None):
    """The FastAPI app over engine `llm`; `expected`: the served checkpoint's tensor shapes, when known."""
    from fastapi import FastAPI, HTTPException, Request
    from pydantic import BaseModel
    from vllm.exceptions import VLLMClientError

    class GenerateRequest(BaseModel):
        prompt_token_ids: list[list[int]]
        max_tokens: int
        temperature: float = 1.0
        top_k: int = 0
        top_p: float = 1.0
        min_p: float = 0.0
        repetition_penalty: float = 1.0
        stop_token_ids: list[int] | None = None
        ignore_eos: bool = False
        min_tokens: list[int] | None = None
        seed: int | None = None
        logprobs: bool = False
        regex: str | None = None

    app = FastAPI(title="rlhfkit vllm-serve")
    lock = threading.Lock()
    weights = WeightUpdate(llm, lock, expected)

    @app.get("/health/")
    def health():
        if weights.broken:
            raise HTTPException(status_code=503, detail=weights.broken)
        return {"status": "ok"}

    @app.get("/info/")
    def get_info():
        return info

    @app.post("/generate/")
    def generate(request: GenerateRequest):
        try:
            params = vllm_common.vllm_sampling_params(request.model_dump())
        except (TypeError, ValueError) as err:
            raise HTTPException(status_code=400, detail=f"invalid sampling settings: {err}") from err
        prompts = [{"prompt_token_ids": ids} for ids in request.prompt_token_ids]
        try:
            with lock:
                outputs = llm.generate(prompts, params, use_tqdm=False)
        except (VLLMClientError, ValueError) as err:  # e.g. a regex the grammar backend cannot compile
            raise HTTPException(status_code=400, detail=f"the engine refused the request: {err}") from err
        return vllm_common.engine_answer(outputs, request.logprobs)

    @app.post("/update_weights/")
    async def update_weights(request: Request, last: bool = True):
        try:
            return weights.add(await request.body(), last)
        except ValueError as err:
            raise HTTPException(status_code=400, detail=str(err)) from err
        except RuntimeError as err:
            raise HTTPException(status_code=500, detail=str(err)) from err

    return app


def served_model_info(llm: Any, args: Any, version: str) -> dict[str, Any]:
    """What `/info/` reports: enough for a client to tell whether this is the trainer's model."""
    config = llm.llm_engine.model_config
    hf = config.hf_text_config
    return {
        "api_version": API_VERSION,
        "model": args.model,
        "architectures": list(getattr(config.hf_config, "architectures", None) or []),
        "vocab_size": config.get_vocab_size(),
        "hidden_size": getattr(hf, "hidden_size", None),
        "num_hidden_layers": getattr(hf, "num_hidden_layers", None),
        "max_model_len": config.max_model_len,
        "dtype": str(config.dtype).removeprefix("torch."),
        "vllm_version": version,
        "logprobs_mode": "processed_logprobs",
    }


def serve(args: Any) -> None:
    """Start the engine for `args` (`VLLMServeArguments`), then serve until interrupted."""
    version = require_vllm()
    import uvicorn
    from vllm import LLM

    llm = LLM(**engine_kwargs(args))
    app = build_app(llm, served_model_info(llm, args, version), checkpoint_shapes(args.model))
    logger.info("rlhfkit vllm-serve: %s on http://%s:%d", args.model, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
