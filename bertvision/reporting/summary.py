"""The verdict: per backbone and task, full fine-tuning against the BERTVision path the pipeline
would pick, with what each cost.

Rows of a block: full fine-tuning (the baseline stage), BERT's own head at each partial
checkpoint, the picked BERTVision path (checkpoint, head, and head alone or head + BERT
ensemble: the highest mean selection score over every candidate), and the best frozen-encoder
head (0 epochs, also by selection). Every choice reads the selection split only; the dev
scores are reported, never compared. Own seconds: full fine-tuning's training time to its kept
epoch; BERT's to its checkpoint; a head's path adds the extraction of that checkpoint's
features (the jobs' wall time) and the head's own training. Whole seconds: the wall time of every
job that had to run to make the row's choice (``reporting.whole_cost``); the verdict is stated on
them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bertvision.registry.peers import get_peer, inapplicable
from bertvision.registry.tasks import get_task
from bertvision.reporting.candidates import FULL_FT, PEER
from bertvision.reporting.choice import bertvision_paths, counted_once, over_seeds, passed_over, pick
from bertvision.reporting.markdown import fmt, markdown_table, seconds_cell
from bertvision.reporting.picks import Pick
from bertvision.reporting.race_line import checkpoint_race_line, head_selection_line
from bertvision.reporting.results import BERT
from bertvision.reporting.significance import paired_interval
from bertvision.reporting.verdict import (
    LEARNING_MARGIN,
    against_best,
    comparison,
    constant_line,
    cost_phrase,
    learned_nothing,
    no_window_line,
    nothing_learned,
)
from bertvision.reporting.whole_cost import SelectionCost

# Row kinds, in the order a block lists them.
ROW_KINDS = (
    FULL_FT,
    "BERT at a checkpoint",
    "BERTVision (picked)",
    "BERTVision within a budget",
    "frozen encoder (best head)",
    # listed right after full fine-tuning: what a practitioner would use instead (registry/peers)
    PEER,
)
SUMMARY_COLUMNS = [
    "backbone",
    "task",
    "row",
    "budget",  # a pick within a budget: the largest checkpoint it chose among
    "checkpoint",
    "model",
    "metric",
    "dev_mean",
    "dev_std",
    "n",
    "ft_seeds",
    "selection_mean",
    "trainable_params",
    "parameter_percent",
    "seconds",
    "seconds_std",
    # everything run to make the row's choice, mean and std over fine-tuning seeds
    "whole_seconds",
    "whole_seconds_std",
    "feature_bytes",
    "score_diff",
    "score_diff_std_units",
    # the 95% paired bootstrap interval over dev's rows (``reporting.significance``) of the row's
    # difference from full fine-tuning, and the picked row's from the verdict's rival (``rival_of``)
    "dev_rows",
    "score_diff_low",
    "score_diff_high",
    "rival_diff_low",
    "rival_diff_high",
    "cost_ratio",
    "whole_cost_ratio",
    # what a constant prediction scores on dev (the bar for having learned anything), and for
    # answerability the answerable dev questions no window wholly holds
    "constant_score",
    "answerable_no_window",
    "device",
    "precision",
    "pair",  # the heads' rows: a pair task's texts encoded as one sequence (joint) or apart
    # a peer whose result does not depend on the seed: one run, its spread zero by construction
    "deterministic",
    "best_dev_any",
    "head_selection",
    "head_runs",
    "raced_out_runs",
    # the path with the best mean selection score where the pick is an earlier checkpoint's within
    # its noise (``reporting.choice.passed_over``): its name, checkpoint, score and the difference's error
    "passed_over",
    "passed_over_checkpoint",
    "passed_over_selection",
    "passed_over_error",
]


def _whole_seconds(label: str, config: pd.Series, cost: SelectionCost) -> tuple[float, float]:
    """Mean and std over fine-tuning seeds of everything run to make a row's choice: the picked
    path's, among every checkpoint; the frozen encoder's best head's, among its checkpoint's
    heads; full fine-tuning's and BERT's, their own runs (``reporting.whole_cost``)."""
    if label == ROW_KINDS[2]:
        return cost.over_checkpoints()
    if label == ROW_KINDS[3]:
        return cost.up_to(config["budget"])
    if label == ROW_KINDS[4]:
        return cost.at_checkpoint(config["checkpoint"])
    return config["whole_seconds"], config["whole_seconds_std"]


def summary_table(runs: pd.DataFrame, picks: list[Pick]) -> pd.DataFrame:
    """One block of rows (ROW_KINDS) per backbone and task, with the ratios against full
    fine-tuning where the baseline ran; the picked row is ``picks``' (``reporting.choice.choose_picks``)."""
    out = []
    if runs.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    picked_paths = {(p.backbone, p.task): p for p in picks}
    for (backbone, task_name), block in runs.groupby(["backbone", "task"], sort=True):
        task = get_task(task_name)
        configs = over_seeds(counted_once(block))
        chosen = []
        full = configs[configs["kind"] == FULL_FT]
        chosen += [(ROW_KINDS[0], r) for _, r in full.iterrows()]
        chosen += [(PEER, r) for _, r in configs[configs["kind"] == PEER].iterrows()]
        partial = configs[(configs["kind"] == BERT) & (configs["checkpoint"] > 0)].sort_values("checkpoint")
        chosen += [(ROW_KINDS[1], r) for _, r in partial.iterrows()]
        paths = bertvision_paths(configs)
        picked = picked_paths.get((backbone, task_name))
        if picked is not None:
            path = paths[(paths["checkpoint"] == picked.checkpoint.fraction) & (paths["model"] == picked.model)]
            chosen.append((ROW_KINDS[2], path.iloc[0]))
        # the same pick among the checkpoints of at most c epochs, for each c between 0 and the largest
        for budget in sorted(set(paths["checkpoint"]))[1:-1]:
            within = pick(paths[paths["checkpoint"] <= budget])
            if within is not None:
                chosen.append((ROW_KINDS[3], pd.concat([within, pd.Series({"budget": budget})])))
        frozen = pick(configs[(configs["kind"] == "head") & (configs["checkpoint"] == 0)])
        if frozen is not None:
            chosen.append((ROW_KINDS[4], frozen))
        ref = full.iloc[0] if len(full) else None
        cost = SelectionCost(block[block["kind"] == "head"])
        # the same for every run on the task's dev split (NaN: records from before they were kept)
        facts = {k: block[k].max() if k in block else np.nan for k in ("constant_score", "answerable_no_window")}
        facts["best_dev_any"] = configs["dev_mean"].max()  # every candidate tried: "no model learned" reads it
        over = passed_over(paths)
        facts |= {
            "passed_over": over[0]["model"] if over else None,
            "passed_over_checkpoint": over[0]["checkpoint"] if over else np.nan,
            "passed_over_selection": over[0]["selection_mean"] if over else np.nan,
            "passed_over_error": over[1] if over else np.nan,
        }
        head_rows = counted_once(block)[lambda b: b["kind"] == "head"]
        protocols = set(head_rows.get("head_selection", pd.Series(dtype=object)).dropna())
        facts |= {
            "head_selection": "racing" if "racing" in protocols else "grid",
            "head_runs": len(head_rows),
            "raced_out_runs": int(head_rows["raced_out"].isin([True]).sum()) if "raced_out" in head_rows else 0,
        }
        rows, predictions = [], []
        for label, r in chosen:
            whole, whole_std = _whole_seconds(label, r, cost)
            predictions.append(r.get("predictions"))
            diff = r["dev_mean"] - ref["dev_mean"] if ref is not None else np.nan
            ref_std = ref["dev_std"] if ref is not None else np.nan
            rows.append(
                {
                    "backbone": backbone,
                    "task": task_name,
                    "row": label,
                    "budget": r.get("budget", np.nan),
                    "checkpoint": r["checkpoint"],
                    "model": r["model"],
                    "metric": task.primary_metric,
                    "dev_mean": r["dev_mean"],
                    "dev_std": r["dev_std"],
                    "n": int(r["n"]),
                    "ft_seeds": int(r["ft_seeds"]),
                    "selection_mean": r["selection_mean"],
                    "trainable_params": int(r["trainable_params"]),
                    "parameter_percent": 100.0 * r["trainable_params"] / r["encoder_params"],
                    "seconds": r["seconds"],
                    "seconds_std": r["seconds_std"],
                    "whole_seconds": whole,
                    "whole_seconds_std": whole_std,
                    "feature_bytes": r["feature_bytes"],
                    "score_diff": diff,
                    "score_diff_std_units": diff / ref_std if ref_std and ref_std > 0 else np.nan,
                    "cost_ratio": r["seconds"] / ref["seconds"] if ref is not None else np.nan,
                    "whole_cost_ratio": whole / ref["whole_seconds"] if ref is not None else np.nan,
                    **facts,
                    "device": r["device"],
                    "precision": r["precision"],
                    "pair": r.get("pair"),
                    "deterministic": bool(r.get("deterministic") is True),
                }
            )
        out += with_intervals(task, pd.DataFrame(rows, columns=SUMMARY_COLUMNS), predictions)
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


def rival_of(block: pd.DataFrame) -> pd.Series | None:
    """The verdict's rival: the best method on the selection split among full fine-tuning and the
    peers, by the pick's own ranking (selection score, then fewer parameters)."""
    return pick(block[block["row"].isin([ROW_KINDS[0], PEER])])


def with_intervals(task, block: pd.DataFrame, predictions: list) -> list[dict]:
    """The block's rows with their paired bootstrap intervals (``reporting.significance``): every
    row's difference from full fine-tuning, the picked row's from the rival; NaN where a side kept no
    predictions."""
    full = block.index[block["row"] == ROW_KINDS[0]]
    picked = block.index[block["row"] == ROW_KINDS[2]]
    rival = rival_of(block)
    for i in block.index:
        pairs = [("score_diff", full[0] if len(full) and i != full[0] else None)]
        pairs += [("rival_diff", rival.name if i in picked and rival is not None else None)]
        for column, other in pairs:
            found = None if other is None else paired_interval(task, predictions[i], predictions[other])
            if found is not None:
                block.loc[i, [f"{column}_low", f"{column}_high", "dev_rows"]] = found
    return block.to_dict("records")


def _method_name(row: pd.Series) -> str:
    return "full fine-tuning" if row["row"] == ROW_KINDS[0] else f"{row['model']} (peer)"


def verdict(block: pd.DataFrame) -> str:
    """Plain words for a block: whether any model learned the task and, if so, the best method on
    the selection split (full fine-tuning, a peer or the BERTVision pick) and where the pick
    stands against it, then against full fine-tuning (``reporting.verdict``)."""
    task = get_task(block["task"].iloc[0])
    picked = block[block["row"] == ROW_KINDS[2]]
    if picked.empty:
        return "No BERTVision path has a selection score yet."
    p = picked.iloc[0]
    what = f"`{p['model']}` on the {p['checkpoint']:g}-epoch checkpoint"
    if learned_nothing(task, block, block["constant_score"].iloc[0]):
        return nothing_learned(task, what)
    full = block[block["row"] == ROW_KINDS[0]]
    if not block["row"].isin([ROW_KINDS[0], PEER]).any():
        return (
            f"The pipeline picks {what}; no full fine-tuning baseline ran (baseline.enabled) and no peer "
            "(peers.methods), so there is no verdict."
        )
    rival = rival_of(block)
    if rival is None:
        lead = f"The pipeline picks {what}."
    else:
        pick_is_best = p["selection_mean"] > rival["selection_mean"]
        lead = against_best(task, p, what, rival, _method_name(rival), pick_is_best)
    if full.empty:
        return f"{lead} No full fine-tuning baseline ran (baseline.enabled)."
    return (
        f"{lead} Against full fine-tuning: {comparison(task, p, full.iloc[0])}, at {cost_phrase(p)} "
        f"and {p['parameter_percent']:.3g}% of its trainable parameters."
    )


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
    table: pd.DataFrame, race_decisions: dict[tuple, list[dict]] | None = None, peers: dict | None = None
) -> str:
    """``race_decisions``: (backbone, task) -> the race's decisions at each checkpoint it reached;
    ``peers``: task -> the peers the config names for it."""
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
        "BERTVision pick) and says where the pick stands against it on dev, then against full fine-tuning; "
        "it is stated on the whole cost. A peer whose result does not depend on the seed (the embedding's linear "
        "model, the cosine) runs once: its spread is zero by construction. "
        "It calls a difference undetermined when the seeds cannot measure a side's spread (one seed, every seed "
        "scoring the same, or one fine-tuning seed behind a path on a fine-tuned checkpoint), noise when the two "
        "mean ± std ranges overlap or when a difference beyond them is not beyond dev's own sampling noise (a 95% "
        "paired bootstrap over dev's rows, each side the mean of its seeds, whose interval holds 0), "
        f"and names no winner where no model tried beats a constant prediction (the same class every time, or "
        f"abstaining on every question) by more than {100 * LEARNING_MARGIN:g}% of the metric's range.",
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
                    r.model,
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
                no_window_line(block),
                pair_line(block),
                race,
                passed_over_line(block),
                skipped,
            )
            if n
        )
        parts += ["", verdict(block), ""] + ([notes, ""] if notes else [])
    parts += [devices_line(table), head_selection_line(table), ""]
    return "\n".join(parts)
