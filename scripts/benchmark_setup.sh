#!/usr/bin/env bash
# `make setup`'s package step through pip and through uv, one after the other on this machine, each
# in a fresh venv of a fresh clone that already holds torch (installed by pip in both, as make setup
# does), from a warm cache and with no cache, each writing every module's bytecode as pip does; prints
# the seconds and uv's ratio to pip.
#   bash scripts/benchmark_setup.sh [REPO]      (about 6 minutes; needs the package index)
set -euo pipefail
repo=$(cd "${1:-$(dirname "$0")/..}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/clone"
cd "$work/clone"
log=$work/step.log
# a step's output is kept in $log, which the exit trap deletes: a failure shows which step and the tail
step() {
    local what=$1 rc=0
    shift
    "$@" > "$log" 2>&1 || rc=$?
    if [ $rc != 0 ]; then
        echo "benchmark_setup: $what failed (exit $rc): $*" >&2
        tail -n 20 "$log" >&2
        exit $rc
    fi
}
declare -A took
for cache in warm cold; do
    for tool in pip uv; do
        rm -rf .venv
        step "making the venv" python3 -m venv .venv
        step "installing torch" .venv/bin/python -m pip install -q torch==2.13.0
        step "installing uv" .venv/bin/python -m pip install -q -c envs/requirements.txt uv
        if [ $tool = pip ]; then
            install=(.venv/bin/python -m pip install -q); [ $cache = cold ] && install+=(--no-cache-dir)
        else
            install=(.venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python); [ $cache = cold ] && install+=(--no-cache)
        fi
        start=$(date +%s.%N)
        step "the $tool install ($cache cache)" "${install[@]}" -c envs/requirements.txt -e '.[all]'
        took[$cache-$tool]=$(echo "$(date +%s.%N) - $start" | bc)
        step "importing the installed packages" .venv/bin/python -c "import bertvision, snakemake, transformers, onnxruntime"
        printf '%s cache, %s: %.1f s (%s packages)\n' $cache $tool "${took[$cache-$tool]}" "$(.venv/bin/python -m pip list 2>/dev/null | tail -n +3 | wc -l)"
    done
    printf '%s cache: uv/pip = %.3f\n' $cache "$(echo "${took[$cache-uv]} / ${took[$cache-pip]}" | bc -l)"
done
