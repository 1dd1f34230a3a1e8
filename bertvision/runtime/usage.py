"""A job's own peak memory and CPU seconds, logged as its last line and read back by the reports.

Why not Snakemake's benchmark file: it samples the process tree of the job's shell (every
second, then every 30 s), so it misses short peaks, and a job forked from the warm pool
(``runtime.warm``) is not in that tree at all: the file then holds the launcher's 17 MB. The
kernel's own high-water mark (``ru_maxrss``) of the process that did the work is exact either
way, for the process it is: a forked job's starts at the pool's (every stage imported, about 360
MiB), which a light job started on its own (a download: about 140 MiB) never reaches; the
requests check reads it as an upper bound."""

from __future__ import annotations

import logging
import re
import resource
from dataclasses import dataclass
from pathlib import Path

_LINE = "job usage: peak memory {mib:.0f} MiB, cpu {cpu:.1f} s"
# also read: the line of jobs forked from the warm pool before every job logged its usage
_PATTERN = re.compile(r"(?:job usage|forked from the warm pool): peak memory (\d+) MiB, cpu ([\d.]+) s")


@dataclass(frozen=True)
class JobUsage:
    peak_mib: float
    cpu_seconds: float


def log_usage(logger: logging.Logger) -> JobUsage:
    """Log this process's peak resident memory and CPU seconds so far (call it last)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    found = JobUsage(usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime)
    logger.info(_LINE.format(mib=found.peak_mib, cpu=found.cpu_seconds))
    return found


def read_usage(log_path: str | Path) -> JobUsage | None:
    """The last usage line of a job's log; None when the log is missing or has none (a job
    that failed, or was written before jobs logged their usage)."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return None
    found = _PATTERN.findall(text)
    if not found:
        return None
    mib, cpu = found[-1]
    return JobUsage(float(mib), float(cpu))
