#!/usr/bin/env bash
# The vLLM sampling table of benchmarks/vllm_generation.py on one CUDA GPU: vLLM server and colocated, against
# rlhfkit's decode loop and TRL 1.16's `generate`, plus GRPO steps sampling on the server against the decode
# loop. Nothing is downloaded: the model is a local folder, or built here.
#
#   bash benchmarks/gpu/vllm_generation.sh MODEL [OUT_JSON] [more vllm_generation.py args]
#
# MODEL: a transformers checkpoint folder with its tokenizer (a real Qwen2.5-0.5B folder, say), or a model
# of benchmarks/prepare.py (v152k-q05: Qwen2.5-0.5B's shape; v152k-h32: the tiny 152k-vocabulary one), built
# here under benchmarks/.work first from seeded random weights when it is not there yet.
# PYTHON (default python3) must have a CUDA build of vLLM and rlhfkit's dependencies (transformers in
# vLLM's range, accelerate, datasets); rlhfkit runs from src/ and is not installed. TRL_PYTHON (default:
# PYTHON) runs the `trl-generate` row and needs TRL 1.16; without it, pass
# `--paths vllm-server,vllm-colocate,decode-loop,grpo-vllm-server,grpo-decode-loop`.
# Everything runs in float32 (equal work with the CPU table); the server and the colocated engine each take
# 30% of the device (TRL's default share for a colocated engine), the trainer the rest.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
MODEL=${1:?usage: $0 MODEL [OUT_JSON] [vllm_generation.py args]}
OUT=${2:-$ROOT/benchmarks/gpu/vllm_generation.json}
PYTHON=${PYTHON:-python3}
TRL_PYTHON=${TRL_PYTHON:-$PYTHON}
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PYTHON" -c "import torch, vllm, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__,
'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
if [ ! -d "$MODEL" ] && [ ! -f "$ROOT/benchmarks/.work/models/$MODEL-policy/config.json" ]; then
    "$PYTHON" benchmarks/prepare.py --sizes "$MODEL"
fi
"$PYTHON" benchmarks/vllm_generation.py --device cuda --models "$MODEL" --vllm-python "$PYTHON" \
    --trl-python "$TRL_PYTHON" --repeats 5 --grpo-steps 4 --out "$OUT" "${@:3}"
