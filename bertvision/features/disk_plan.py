"""The bytes an extraction shard's features will take, and whether its disk has them: a job refuses
to start on a disk too small rather than fail half-way."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from bertvision.data.tokenized import TokenizedSplit
from bertvision.errors import DiskSpaceError
from bertvision.features.shard_writer import shard_rows

log = logging.getLogger(__name__)


def planned_bytes(
    split: TokenizedSplit,
    shard: int,
    n_shards: int,
    layers: int,
    hidden: int,
    kind: str,
    level: str,
    widths: dict[str, int],
) -> int:
    """``level``: the extraction's feature level ('cls' or 'tokens'); ``widths``: the per-example
    states stored and their width per layer."""
    start, end = shard_rows(len(split), n_shards, shard)
    tokens = int(split.lengths[start:end].sum())
    per_example = sum(widths.values()) * (end - start)  # example tasks' rows
    if level == "cls":
        units = per_example
    else:  # example tasks keep their per-example rows beside the tokens
        units = tokens * hidden if kind == "span" else tokens * hidden + per_example
    return units * layers * 2


def readable_size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def check_disk_space(out_dir: Path, needed: int, headroom: float = 1.05) -> int:
    """The bytes free on ``out_dir``'s disk; DiskSpaceError if fewer than ``needed`` (with ``headroom``)."""
    free = shutil.disk_usage(out_dir).free
    log.info(
        "planned feature bytes for this shard: %s (%.1f MiB); free on disk: %.1f MiB",
        f"{needed:,}",
        needed / 2**20,
        free / 2**20,
    )
    if free < needed * headroom:
        raise DiskSpaceError(
            f"{out_dir}: this shard needs about {readable_size(needed)} of features but only "
            f"{readable_size(free)} is free; free space or use more shards on other disks"
        )
    return free
