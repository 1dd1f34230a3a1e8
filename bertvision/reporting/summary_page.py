"""The summary page: the summary table (``reporting.summary``) as Markdown, a block per backbone
and task with its verdict (``reporting.verdict``) and the notes that explain it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bertvision.data.task_files import repeats_note
from bertvision.registry.peers import get_peer, inapplicable
from bertvision.registry.tasks import get_task
from bertvision.reporting.candidates import PEER
from bertvision.reporting.markdown import fmt, markdown_table, seconds_cell
from bertvision.reporting.race_line import checkpoint_race_line, head_selection_line
from bertvision.reporting.summary import ROW_KINDS
from bertvision.reporting.verdict import LEARNING_MARGIN, constant_line, no_window_line, unlearned_line, verdict


def peer_lines(task_name: str, configured: list[str]) -> str:
    """One sentence per configured peer that does not apply to the task, saying why."""
    task = get_task(task_name)
    return " ".join(
        f"{get_peer(name).label} does not apply here: {why}." for name, why in inapplicable(configured, task).items()
    )


def passed_over_line(block: pd.DataFrame) -> str:
    """Why the pick is not the path with the best mean selection score, where it is not."""
    first = block.iloc[0]
    picked = block[block["row"] == ROW_KINDS[2]]
    if "passed_over" not in block or not isinstance(first["passed_over"], str) or picked.empty:
        return ""
    gain = first["passed_over_selection"] - picked["selection_mean"].iloc[0]
    return (
        f"`{first['passed_over']}` on the {first['passed_over_checkpoint']:g}-epoch checkpoint scored "
        f"{gain:+.4f} above the pick on selection, within the standard error of the difference "
        f"({first['passed_over_error']:.4f}): the pick does not pay for further fine-tuning whose gain the "
        "seeds cannot tell from noise."
    )


def pair_line(block: pd.DataFrame) -> str:
    """Which form of a pair task the head rows read, where some read it apart."""
    heads = block[block["row"].isin(ROW_KINDS[2:5])]
    apart = heads["pair"].isin(["apart"])
    if not apart.any():
        return ""
    which = "The heads" if apart.all() else "The heads of " + ", ".join(sorted(set(heads["model"][apart])))
    return (
        f"{which} read each pair encoded apart (each text alone, per layer [u, v, |u-v|, u*v] of the two "
        "texts' states: heads.models.<head>.pair, chosen on selection among the heads of either form); fine-tuning, "
        "BERT's own head and full fine-tuning read it as one sequence."
    )


def repeats_line(rows: dict | None) -> str:
    """The task's rows that repeat a train row's texts (its download's ``layout.rows_record``)."""
    notes = [repeats_note(n, rows["rows"][split], split) for split, n in (rows or {}).get("repeated", {}).items()]
    return " ".join(f"{n[0].upper()}{n[1:]}." for n in notes if n)


def searched_line(block: pd.DataFrame) -> str:
    """What † marks, where a row's head was searched."""
    if not block["searched"].eq(True).any():
        return ""
    return (
        "† its parameters the optuna search's best (search.md), drawn on the selection split, which the pick "
        "reads too: its selection score is optimistic, and dev, which neither reads, is what is compared here."
    )


def drawn_line(rows: dict | None) -> str:
    """The splits the run drew a share of (``tasks.<task>.train_size``, ``selection_size``,
    ``eval_size``), with how many rows their source held, and those that asked for more rows than
    there were (the download's ``layout.rows_record``)."""
    drawn = []
    order = {"train": 0, "selection": 1}  # then the evaluation splits
    for split, d in sorted((rows or {}).get("drawn", {}).items(), key=lambda item: order.get(item[0], 2)):
        if d["rows"] < d["of"]:
            # train's draw: before the selection carve, or a question task's after its article split
            when = " (before the selection split)" if d.get("before_selection", True) else " (after the article split)"
            drawn.append(f"{d['rows']:,} of the {d['of']:,} {split} rows" + (when if split == "train" else ""))
        elif (d.get("asked") or 0) > d["of"]:
            drawn.append(f"all {d['of']:,} {split} rows (asked {d['asked']:,})")
    return f"Drawn with data.seed: {', '.join(drawn)}." if drawn else ""


def devices_line(table: pd.DataFrame) -> str:
    """Where each kind of row computed, and the encoder's precision there (records from before
    precisions were recorded: unknown)."""
    used = []
    for label, rows in (("full fine-tuning", table[table["row"] == ROW_KINDS[0]]),
                        ("BERT", table[table["row"] == ROW_KINDS[1]]),
                        ("the heads' states", table[table["row"].isin(ROW_KINDS[2:5])]),
                        ("the peers", table[table["row"] == PEER])):  # fmt: skip
        pairs = sorted({f"{d} {p if isinstance(p, str) else 'precision unknown'}" for d, p in
                        zip(rows["device"], rows["precision"]) if isinstance(d, str)})  # fmt: skip
        if pairs:
            used.append(f"{label} on {', '.join(pairs)}")
    return f"Devices and precision: {'; '.join(used)}." if used else ""


def summary_markdown(
    table: pd.DataFrame,
    race_decisions: dict[tuple, list[dict]] | None = None,
    peers: dict | None = None,
    rows_records: dict[str, dict] | None = None,
) -> str:
    """``race_decisions``: (backbone, task) -> the race's decisions at each checkpoint it reached;
    ``peers``: task -> the peers the config names for it; ``rows_records``: task -> its download's rows record."""
    parts = [
        "# Summary: does the BERTVision path pay off?",
        "",
        "Per task: the encoder fine-tuned the standard way (full fine-tuning, the epoch kept chosen on the "
        "selection split), the peers a practitioner would use instead (the backbone's own sentence embedding with a "
        "linear model or the cosine, LoRA, BitFit, SetFit: each chooses its own settings on the selection split; "
        "its whole seconds are its jobs', every setting it tried and the task's one encoding for the embedding's "
        "peers included), BERT's own head after the short "
        "partial fine-tuning, the BERTVision path the "
        "pipeline picks (checkpoint, head, alone or with BERT: the best mean **selection** score), and the "
        "best head on the untouched encoder. Dev scores and own seconds are mean ± sample std over seeds (n runs: "
        "fine-tuning seeds × head seeds). Own seconds: full fine-tuning's training to its kept epoch; a head's path "
        "= fine-tuning to its checkpoint + extracting its features + training the head. Whole seconds (mean ± std "
        "over fine-tuning seeds): the wall time of every job run to make the row's choice (Snakemake's benchmark "
        "files: set-up, loading and scoring included). Full fine-tuning: its job (every epoch, scored after each). "
        "The picked path: the fine-tuning jobs to the largest checkpoint and BERT's scoring at each (the ensembles "
        "read it), every checkpoint's extraction, head and "
        "search jobs (every head and head seed, every trial) and the race's decisions (under racing, of the "
        "checkpoints the race reached, the head runs it stopped early included). Checkpoint 0 is the untouched "
        "encoder, the same for every fine-tuning seed: its extraction, heads and searches run once, and each "
        "fine-tuning seed carries an even share of them. The frozen encoder's best head: checkpoint 0's jobs "
        "alone, one run. BERT at a checkpoint: its fine-tuning jobs and its scoring job (it chooses "
        "nothing), with, where it was scored from the extraction's pass, that pass's seconds on the scored splits. "
        "Data-fraction and transfer runs are not counted. Δ = dev score minus full fine-tuning's, in points and "
        "in full fine-tuning's std; own and whole cost = mean own or whole seconds / full fine-tuning's. "
        "The verdict first names the best method on the selection split (full fine-tuning, a peer or the "
        "BERTVision pick) and says where the pick stands against it on dev, then, where that is another method, "
        "against full fine-tuning; it is stated on the whole cost. A peer whose result does not depend on the seed "
        "(the embedding's linear model, the cosine) runs once: its spread is zero by construction. "
        "It calls a difference undetermined when the seeds cannot measure a side's spread (one seed, every seed "
        "scoring the same, or one fine-tuning seed behind a path on a fine-tuned checkpoint), noise when the two "
        "mean ± std ranges overlap or when a difference beyond them is not beyond dev's own sampling noise (a 95% "
        "paired bootstrap over dev's rows, each side the mean of its seeds, whose interval holds 0), "
        f"and names no winner where no model tried beats a constant prediction (the same class every time, or "
        f"abstaining on every question) by more than {100 * LEARNING_MARGIN:g}% of the metric's range, or where "
        "neither the pick nor the best method on the selection split beats it beyond dev's sampling noise (a 95% "
        "bootstrap of its score over dev's rows that reaches down to the constant's).",
        "",
    ]
    if table.empty:
        return "\n".join(parts + ["No results yet.", ""])
    for (backbone, task_name), block in table.groupby(["backbone", "task"], sort=False):
        task = get_task(task_name)
        scale = task.metric_scale()
        parts += [f"## {task_name} ({backbone}; {task.primary_metric}, {task.eval_splits[0]})", ""]
        rows = []
        for r in block.itertuples():
            checkpoint = "" if np.isnan(r.checkpoint) else f"{r.checkpoint:g}"
            reference = r.row == ROW_KINDS[0]
            delta = (
                ""
                if reference or np.isnan(r.score_diff)
                else f"{r.score_diff * 100 / scale:+.1f}"
                + ("" if np.isnan(r.score_diff_std_units) else f" ({r.score_diff_std_units:+.1f} std)")
            )
            rows.append(
                [
                    r.row if np.isnan(r.budget) else f"BERTVision (picked, ≤ {r.budget:g} epochs)",
                    checkpoint,
                    r.model + (" †" if r.searched is True else ""),
                    fmt(r.dev_mean, r.dev_std, scale) + (" (no seed: exact)" if r.deterministic is True else ""),
                    str(r.n),
                    f"{r.parameter_percent:.3g}",
                    seconds_cell(r.seconds, r.seconds_std),
                    seconds_cell(r.whole_seconds, r.whole_seconds_std),
                    "" if np.isnan(r.feature_bytes) or not r.feature_bytes else f"{r.feature_bytes / 2**20:.1f}",
                    delta,
                    "" if reference or np.isnan(r.cost_ratio) else f"{r.cost_ratio:.2f}×",
                    "" if reference or np.isnan(r.whole_cost_ratio) else f"{r.whole_cost_ratio:.2f}×",
                ]
            )
        parts.append(
            markdown_table(
                [
                    "",
                    "epochs",
                    "model",
                    f"dev {task.primary_metric}",
                    "n",
                    "% params",
                    "own seconds",
                    "whole seconds",
                    "features MiB",
                    "Δ vs full FT",
                    "own cost",
                    "whole cost",
                ],
                rows,
            )
        )
        race = checkpoint_race_line((race_decisions or {}).get((backbone, task_name), []))
        skipped = peer_lines(task_name, (peers or {}).get(task_name, []))
        notes = " ".join(
            n
            for n in (
                constant_line(task, block["constant_score"].iloc[0]),
                unlearned_line(task, block),
                no_window_line(block),
                pair_line(block),
                searched_line(block),
                drawn_line((rows_records or {}).get(task_name)),
                repeats_line((rows_records or {}).get(task_name)),
                race,
                passed_over_line(block),
                skipped,
            )
            if n
        )
        parts += ["", verdict(block), ""] + ([notes, ""] if notes else [])
    parts += [devices_line(table), head_selection_line(table), ""]
    return "\n".join(parts)
