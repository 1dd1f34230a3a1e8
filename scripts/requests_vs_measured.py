"""Every job's memory request beside its measured peak, for a finished run (issue 22).

The requests are what Snakemake would ask a cluster for on the first attempt: this script runs
the workflow's dry run over every job (``-n --forceall``) with the run's config and reads the
``resources:`` of each. The peaks are the usage line each job's log ends with
(``bertvision.runtime.usage``). ``--check`` fails when a peak exceeds its request or a request
is more than 3x its peak (above 2 GiB), or a job ran longer than its runtime request.

    python scripts/requests_vs_measured.py --configfile configs/paper-shape-smoke.yaml \\
        [-d RUN_DIR] [--out docs/results/paper-shape-requests.md] [--check]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from bertvision.reporting.request_usage import WASTE_LIMIT, planned_jobs, report, requests_table
from bertvision.script_support import ScriptError, run_directory, run_script

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configfile", nargs="+", required=True)
    parser.add_argument("-d", "--directory", type=Path, default=Path("."))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--profile", help="e.g. profiles/slurm: the requests that profile's defaults give")
    args = parser.parse_args()
    run_directory(args.directory)  # before Snakemake, which would make it (and its .snakemake) to plan in
    missing = [name for name in args.configfile if not Path(name).is_file()]
    if missing:
        raise ScriptError(f"--configfile: {', '.join(missing)}: no such file")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile"), "-d", str(args.directory)]
    cmd += ["-n", "--forceall", "--cores", "all", "--configfile", *args.configfile]
    if args.profile:
        cmd += ["--profile", args.profile]
    dry = subprocess.run(cmd, capture_output=True, text=True)
    if dry.returncode != 0:
        print(dry.stdout[-3000:], dry.stderr[-3000:], sep="\n", file=sys.stderr)
        return dry.returncode
    table = requests_table(planned_jobs(dry.stdout), args.directory)
    text = report(table)
    if args.out:
        args.out.write_text(text)
    print(text)
    if args.check:
        bad = table[table["verdict"] != "ok"]
        for row in bad.itertuples(index=False):
            print(
                f"{row.verdict}: {row.rule} {row.job}: request {row.request_mib} MiB, peak {row.peak_mib} MiB",
                file=sys.stderr,
            )
        if len(bad):
            print(
                f"{len(bad)} of {len(table)} jobs over their request (memory or runtime), "
                f"above {WASTE_LIMIT}x it, or not run",
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    run_script(main)
