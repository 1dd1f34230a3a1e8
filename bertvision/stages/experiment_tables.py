"""The ``experiment_tables`` stage: the optuna searches, the data-fraction curves,
cross-checkpoint transfer and BERT's own fine-tuning curve, each as Markdown and CSV."""

from __future__ import annotations

from pathlib import Path

from bertvision.layout import head_metrics_files, table
from bertvision.reporting.bert_curve import bert_curve_markdown, bert_curve_table
from bertvision.reporting.experiments import (
    data_fraction_markdown,
    data_fraction_table,
    search_markdown,
    search_table,
    transfer_markdown,
    transfer_table,
)
from bertvision.reporting.markdown import write_csv, write_text

TABLE_NAMES = ("search", "data_fraction", "transfer", "bert_curve")


def build_experiment_tables(
    out_dir: Path,
    best_files: list[Path] = (),
    subset_dirs: list[Path] = (),
    head_dirs: list[Path] = (),
    bert_metrics: list[Path] = (),
    transfer_files: list[Path] = (),
    curve_files: list[Path] = (),
) -> None:
    tables = {
        "search": (search_table(best_files), search_markdown),
        "data_fraction": (
            data_fraction_table(head_metrics_files(subset_dirs), head_metrics_files(head_dirs), bert_metrics),
            data_fraction_markdown,
        ),
        "transfer": (transfer_table(transfer_files, bert_metrics), transfer_markdown),
        "bert_curve": (bert_curve_table(curve_files), bert_curve_markdown),
    }
    for name, (frame, markdown) in tables.items():
        write_csv(frame, table(name, "csv", out_dir))
        write_text(markdown(frame), table(name, "md", out_dir))
