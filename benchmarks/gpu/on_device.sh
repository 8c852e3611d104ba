#!/usr/bin/env bash
# The GPU machine's side of benchmarks/gpu (RESULTS_GPU.md records the exact calls and their output).
#
#   bash benchmarks/gpu/on_device.sh check [check_cuda.py args]   # every trainer on cuda, fp32 and bf16
#   bash benchmarks/gpu/on_device.sh bench SIZES REPEATS          # run_gpu.py: rlhfkit vs TRL 1.16 on cuda
#
# Why a script: the machine has no network and an older transformers, so wheels of the dev venv's versions
# travel in .whl/ (git-ignored) and are installed into /tmp/site, ahead of site-packages on PYTHONPATH.
# rlhfkit runs from src/ (not pip-installed: its torch pin would pull a wheel). Paths are absolute because
# the workloads run inside benchmarks/workloads. If benchmarks/.work/head-src holds `git archive HEAD src`,
# checks that fail on the working tree are re-run on HEAD, to tell a CUDA bug from work in progress.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
if [ ! -f /tmp/site/.installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$ROOT"/.whl/*.whl && touch /tmp/site/.installed || exit 1
fi
export PYTHONPATH="$ROOT/src:/tmp/site" PYTHONUNBUFFERED=1 RLHFKIT_CACHE=/tmp/rlhfkit-cache \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-$ROOT/benchmarks/.work/gpu/out}
mkdir -p "$OUT"

case "${1:-check}" in
    check)
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        python3 benchmarks/gpu/check_cuda.py --out "$OUT" "${@:2}" 2>&1 | tee "$OUT/check_cuda.log"
        failed=$(python3 -c "import json,sys; print(','.join(r['check'] for r in json.load(open(sys.argv[1]))['results'] if r['status'] != 'PASS'))" "$OUT/check_cuda.json")
        if [ -n "$failed" ] && [ -d "$ROOT/benchmarks/.work/head-src/src" ]; then
            echo "=== re-running on HEAD's src: $failed"
            PYTHONPATH="$ROOT/benchmarks/.work/head-src/src:/tmp/site" python3 benchmarks/gpu/check_cuda.py \
                --out "$OUT" --json-name check_cuda_head.json --only "$failed" 2>&1 | tee "$OUT/check_cuda_head.log"
        fi
        ;;
    bench)
        prev=()
        [ -f /tmp/gpu-bench/results_gpu.json ] && prev=(--merge /tmp/gpu-bench/results_gpu.json)
        python3 benchmarks/gpu/run_gpu.py --work-dir /tmp/bench-work --prepare --sizes "${2:-tiny,small}" \
            --repeats "${3:-2}" --out "$OUT" "${prev[@]}" "${@:4}" 2>&1 | tee "$OUT/run_gpu.log"
        mkdir -p /tmp/gpu-bench && cp "$OUT/results_gpu.json" /tmp/gpu-bench/ 2>/dev/null
        ;;
    *)
        echo "usage: $0 check [check_cuda.py args] | bench SIZES REPEATS [run_gpu.py args]" >&2
        exit 2
        ;;
esac
