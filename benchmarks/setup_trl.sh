#!/usr/bin/env bash
# Create the virtualenvs of the benchmark harness (idempotent).
# TRL is never a dependency of rlhfkit: it lives only in benchmarks/.venvs/. The `rlhfkit` venvs are clean
# editable installs of this checkout with the optional packages of the TRL venv they are compared with:
# `rlhfkit` (no extras) beside trl-new, `rlhfkit-diffusion` (diffusers and Pillow, which transformers imports
# whenever it is installed) beside trl-0.11, which has diffusers for DDPO.
#   bash benchmarks/setup_trl.sh                    # all four venvs
#   bash benchmarks/setup_trl.sh trl-0.11 rlhfkit   # some of them
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python3.11}"
VENVS="$HERE/.venvs"
mkdir -p "$VENVS"

make_venv() {  # NAME CONSTRAINTS PACKAGE...: constraints-CONSTRAINTS.txt pins the versions
  local name="$1" constraints="$HERE/constraints-$2.txt"; shift 2
  local venv="$VENVS/$name" stamp="$VENVS/$name/.installed"
  # The stamp holds the pins and packages it was built from: a change reinstalls.
  local want; want="$(cat "$constraints"; echo "# packages: $*")"
  if [[ -f "$stamp" ]] && [[ "$(cat "$stamp")" == "$want" ]]; then
    echo "[setup_trl] $name: up to date"
    return
  fi
  # a changed package list rebuilds from scratch: pip would leave what a dropped package had pulled in
  if [[ -f "$stamp" ]]; then rm -rf "$venv"; fi
  echo "[setup_trl] $name: installing into $venv"
  test -x "$venv/bin/python" || "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install -q -c "$constraints" torch==2.13.0
  "$venv/bin/python" -m pip install -q -c "$constraints" "$@"
  printf '%s\n' "$want" > "$stamp"
}

ROOT="$(cd "$HERE/.." && pwd)"
targets=("${@:-trl-0.11 trl-new rlhfkit rlhfkit-diffusion}")
for t in ${targets[@]}; do
  case "$t" in
    trl-0.11) make_venv trl-0.11 trl-0.11 trl transformers accelerate peft datasets diffusers numpy pyarrow psutil rich tyro ;;
    trl-new)  make_venv trl-new trl-new trl transformers accelerate peft datasets psutil ;;
    rlhfkit)  make_venv rlhfkit rlhfkit -e "$ROOT" ;;
    rlhfkit-diffusion) make_venv rlhfkit-diffusion rlhfkit -e "$ROOT[diffusion]" ;;
    *) echo "unknown venv '$t' (expected trl-0.11, trl-new, rlhfkit or rlhfkit-diffusion)" >&2; exit 2 ;;
  esac
done
