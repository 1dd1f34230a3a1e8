"""Writing tables: Markdown and CSV, each renamed into place."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.files import atomic_path


def fmt(mean: float, std: float, scale: float = 1.0) -> str:
    """``mean ± std`` (just the mean when there is no std); 3 decimals on a 0-1 scale, 2 on 0-100."""
    digits = 2 if scale > 1 else 3
    return f"{mean:.{digits}f}" if np.isnan(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def seconds_cell(mean: float, std: float) -> str:
    """``mean ± std`` seconds (the mean alone for one seed; empty when unknown)."""
    if np.isnan(mean):
        return ""
    return f"{mean:.1f}" + ("" if np.isnan(std) else f" ± {std:.1f}")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_text(text: str, path: Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


PAGE_STYLE = (
    "body{font-family:sans-serif;max-width:70em} table{border-collapse:collapse} "
    "td,th{border:1px solid #bbb;padding:2px 6px}"
)


def markdown_page(markdown: str, title: str) -> str:
    """``markdown`` (its tables too) as an HTML page of its own: Snakemake's HTML report shows an
    HTML result, and offers a Markdown one only for download."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)  # heads.models.<head> is text
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{PAGE_STYLE}</style></head>\n<body>\n{body}</body></html>\n"
    )


def _csv_float(value: float) -> str:
    """6 significant digits, but a whole number whole: a byte or row count held as a float (a mean
    over seeds, or beside a NaN) read back as written (1,023,648 bytes were 1.02365e+06)."""
    return f"{value:.0f}" if float(value).is_integer() and abs(value) < 1e15 else f"{value:.6g}"


def write_csv(df: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False, float_format=_csv_float)
