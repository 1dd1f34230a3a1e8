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
declare -A took
for cache in warm cold; do
    for tool in pip uv; do
        rm -rf .venv
        python3 -m venv .venv
        .venv/bin/python -m pip install -q torch==2.13.0 2>/dev/null
        .venv/bin/python -m pip install -q -c envs/requirements.txt uv 2>/dev/null
        if [ $tool = pip ]; then
            install=(.venv/bin/python -m pip install -q); [ $cache = cold ] && install+=(--no-cache-dir)
        else
            install=(.venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python); [ $cache = cold ] && install+=(--no-cache)
        fi
        start=$(date +%s.%N)
        "${install[@]}" -c envs/requirements.txt -e '.[all]' 2>/dev/null
        took[$cache-$tool]=$(echo "$(date +%s.%N) - $start" | bc)
        .venv/bin/python -c "import bertvision, snakemake, transformers, onnxruntime" # the install works
        printf '%s cache, %s: %.1f s (%s packages)\n' $cache $tool "${took[$cache-$tool]}" "$(.venv/bin/python -m pip list 2>/dev/null | tail -n +3 | wc -l)"
    done
    printf '%s cache: uv/pip = %.3f\n' $cache "$(echo "${took[$cache-uv]} / ${took[$cache-pip]}" | bc -l)"
done
