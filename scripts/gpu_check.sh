#!/usr/bin/env bash
# The GPU check (issue 46), one short script for a machine with a GPU (under 3 minutes on an H100
# or H200 as run before step 4, docs/operations.md; issue 46 allows 10), run from the repository root:
#   1. the default config end to end on the GPU: fine-tuning, full fine-tuning, extraction and the
#      peers on `auto` devices (the GPU) with precision `auto`, measured on the GPU; a head job;
#   2. extraction throughput at bert-base shape (random weights, batch 64 x 128 tokens, precision
#      auto: bf16 on a GPU that supports it), sequences per second and MFU;
#   3. the service on the run's picked bundles at 32 clients;
#   4. heads of one kind trained as one batched module, and in lockstep, against one by one (issue 45);
# and writes docs/results/gpu-check-<GPU>.md naming the GPU (or the file given as $1).
#
#   bash scripts/gpu_check.sh                   # on the GPU machine
#   bash scripts/gpu_check.sh --dry-run OUT.md  # anywhere: the workflow's plan only (snakemake -n),
#                                               # throughput for 1 s, no service (the tests run it)
# Environment: GPU_CHECK_WORKFLOW_LIMIT (seconds, default 360) bounds the workflow; GPU_CHECK_COMMIT
# names the commit where the copy has no .git; GPU_CHECK_NOTE adds a line to the provenance;
# GPU_CHECK_LOGS, a folder, keeps the workflow's output, logs and tables.
set -euo pipefail

dry_run=0
if [[ "${1:-}" == "--dry-run" ]]; then dry_run=1; shift; fi
PY=$(command -v "${PYTHON:-python}") || {
    echo "gpu_check: no ${PYTHON:-python} on PATH; activate the venv (make setup) or set PYTHON" >&2
    exit 2
}
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # absolute, the venv's link kept: the run is elsewhere
if [[ $dry_run == 0 ]] && ! nvidia-smi > /dev/null 2>&1; then
    echo "gpu_check: no GPU here (nvidia-smi failed); run with --dry-run to check the script on a CPU" >&2
    exit 2
fi
if [[ $dry_run == 1 ]]; then
    gpu="none (dry run on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
else
    gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
fi
slug=$(echo "${gpu%%,*}" | tr '[:upper:] ' '[:lower:]-' | tr -cd 'a-z0-9-')
out=${1:-docs/results/gpu-check-$slug.md}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
commit=${GPU_CHECK_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}
started=$(date -u +"%Y-%m-%d %H:%M:%S UTC")

# 1. the default config in a fresh working directory: the working tree's files as they are on disk
# (tracked and untracked but not ignored; not `git archive HEAD`: a machine sent a copy of the tree
# may hold an older .git), nothing of an earlier run. A copy without .git, as a GPU machine may be
# given, is taken whole but for dot folders: it holds no run outputs.
if git rev-parse --git-dir > /dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -c 2> /dev/null \
        | tar -x -C "$work"
else
    tar -c --exclude='./.*' . | tar -x -C "$work"
fi
# The greedy scheduler: the check must not depend on an ILP solver being installed (PuLP's CBC).
snakemake=($PY -m snakemake --scheduler greedy)
workflow_rc=0
if [[ $dry_run == 1 ]]; then
    # its output is in $work, which the exit trap deletes: show the failure's tail before going
    (cd "$work" && "${snakemake[@]}" -n --cores 2 > "$work/snakemake.txt" 2>&1) || {
        rc=$?
        echo "gpu_check: the workflow's dry run failed (exit $rc, $PY -m snakemake); its output ends:" >&2
        tail -n 20 "$work/snakemake.txt" >&2
        exit "$rc"
    }
    workflow="dry run: $(awk '$1 == "total" {print $2; exit}' "$work/snakemake.txt") jobs planned"
else
    t0=$(date +%s)
    # bounded, so that a stuck workflow still leaves time for the throughput and its report
    (cd "$work" && timeout "${GPU_CHECK_WORKFLOW_LIMIT:-360}" "${snakemake[@]}" --keep-going --cores "$(nproc)" \
        > "$work/snakemake.txt" 2>&1) || workflow_rc=$?
    workflow="$(grep -m1 'Elapsed time' "$work/snakemake.txt" || echo "$(( $(date +%s) - t0 )) s") of workflow"
    [[ $workflow_rc == 0 ]] || workflow="$workflow, FAILED (exit $workflow_rc)"
fi

# 2. extraction throughput at bert-base shape
seconds=20 batch=64; [[ $dry_run == 1 ]] && seconds=1 batch=4
$PY scripts/benchmark.py --throughput-only --throughput-batch $batch --throughput-seconds $seconds \
    > "$work/throughput.txt" 2>&1 || echo "(throughput failed, exit $?)" >> "$work/throughput.txt"

# 3. the service at 32 clients on the picked bundles
if [[ $dry_run == 0 && -d "$work/bundles/minilm-l6/picked" ]]; then
    $PY scripts/benchmark_serve.py --bundle "$work/bundles/minilm-l6/picked" --concurrency 32 --seconds 20 \
        --memory-requests --burst 0 > "$work/serve.txt" 2>&1 || echo "(service failed, exit $?)" >> "$work/serve.txt"
elif [[ $dry_run == 0 ]]; then
    echo "(no picked bundles: the workflow did not finish)" > "$work/serve.txt"
else
    echo "(dry run: no service)" > "$work/serve.txt"
fi

# 4. heads of one kind as one batched module (issue 45), where it could pay: on a GPU a small head's
# step costs its kernel launches, not its arithmetic (on a CPU: docs/results/heads-stacked-*.txt).
# The step of 3, 6 and 15 adapters stacked by hand and by torch.func's vmap against one by one, and
# the head job's lockstep against one by one on the run's STS-B states at the untouched encoder.
heads_device=cuda steps=200 rounds=5 members=(3 6 15)
[[ $dry_run == 1 ]] && heads_device=cpu steps=2 rounds=1 members=(3)
$PY scripts/benchmark_stacked_step.py --device $heads_device --threads 1 --members "${members[@]}" --steps $steps \
    --rounds $rounds > "$work/heads.txt" 2>&1 || echo "(the stacked step failed, exit $?)" >> "$work/heads.txt"
states=$work/features/minilm-l6/stsb/ft1/ckpt-0/manifest.json
if [[ -f "$states" ]]; then
    $PY scripts/benchmark_heads_together.py --task stsb --manifest "$states" --config "$work/config.yaml" \
        --seeds 1 2 3 --rounds 1 --device $heads_device >> "$work/heads.txt" 2>&1 \
        || echo "(heads together failed, exit $?)" >> "$work/heads.txt"
else
    echo "(no stored STS-B states at the untouched encoder: the workflow did not make them)" >> "$work/heads.txt"
fi

if [[ -n "${GPU_CHECK_LOGS:-}" ]]; then  # the run's logs and tables kept beside the report
    mkdir -p "$GPU_CHECK_LOGS"
    cp "$work"/{snakemake,throughput,serve,heads}.txt "$GPU_CHECK_LOGS"/
    (cd "$work" && tar -czf "$GPU_CHECK_LOGS/run-files.tar.gz" $(ls -d results logs benchmarks 2>/dev/null)) || true
fi
mkdir -p "$(dirname "$out")"
{
    echo "> **Provenance.** \`bash scripts/gpu_check.sh\` at commit $commit, started $started. GPU: $gpu."
    echo "> Workflow: the default config.yaml, devices and precision auto; $workflow. Unedited output below."
    [[ -z "${GPU_CHECK_NOTE:-}" ]] || echo "> $GPU_CHECK_NOTE"
    echo
    echo "## The default run"
    echo
    # a dry run prints its job stats at its start and again at its end: once here
    if [[ $dry_run == 1 ]]; then awk '/^Job stats/ {on = 1} on {print} on && $1 == "total" {exit}' "$work/snakemake.txt"
    else
        if [[ $workflow_rc == 0 ]]; then
            cat "$work/results/tables/summary.md"; echo; cat "$work/results/tables/timing.md"
        else
            echo '```'; tail -n 60 "$work/snakemake.txt"; echo '```'
            for log in $(grep -o "logs/[^ ]*\.log" "$work/snakemake.txt" | sort -u | head -3); do
                echo; echo "$log:"; echo '```'; tail -n 30 "$work/$log" 2>/dev/null; echo '```'
            done
        fi
    fi
    echo
    echo "## Extraction throughput, bert-base shape, 128 tokens"
    echo
    grep -v " INFO " "$work/throughput.txt"
    echo
    echo "## The service at 32 clients"
    echo
    grep -v " INFO " "$work/serve.txt"
    echo
    echo "## Heads of one kind stacked, and heads in lockstep, against one by one"
    echo
    echo '```'; cat "$work/heads.txt"; echo '```'
} > "$out"
echo "gpu_check: wrote $out"
