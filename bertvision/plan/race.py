"""The runs the pick chose among: every configured checkpoint under the grid; under racing, the
first ones up to where the race stopped fine-tuning. Each decision is a file written by a
Snakemake checkpoint job (rules/race.smk), read once it has run: ``decision_file(model, task,
checkpoint_name)`` gives its path, or raises Snakemake's IncompleteCheckpointException while it
has not, which holds back only the input function that asked."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from bertvision.config.workflow import WorkflowSettings
from bertvision.layout import HEADS_DIR, RACE_DECISION, Checkpoint, Run


class RaceReach:
    def __init__(self, settings: WorkflowSettings, decision_file: Callable[[str, str, str], str]):
        self.s, self.decision_file = settings, decision_file

    def checkpoints(self, model: str, task: str) -> list[Checkpoint]:
        """The checkpoints of a task's fine-tuning runs that took part in its pick."""
        s = self.s
        if not s.head_race().racing:
            return s.checkpoints
        reached = []
        for checkpoint in s.checkpoints:
            reached.append(checkpoint)
            if checkpoint == s.checkpoints[-1]:
                break
            decision = self.decision_file(model, task, checkpoint.name)
            if not json.loads(Path(decision).read_text())["go_on"]:
                break
        return reached

    def runs_of(self, model: str, task: str) -> list[Run]:
        """The runs of one backbone and task that the race reached."""
        reached = self.checkpoints(model, task)
        return [run for run in self.s.runs([task]) if run.model == model and run.checkpoint in reached]

    def runs(self, tasks: list[str] | None = None, models: list[str] | None = None) -> list[Run]:
        """``WorkflowSettings.runs`` of the checkpoints the race reached, every backbone's or
        ``models``' (a rule of one backbone reads only its own backbone's race decisions)."""
        tasks = self.s.tasks if tasks is None else tasks
        models = self.s.models if models is None else models
        return [run for m in models for t in tasks for run in self.runs_of(m, t)]

    def decisions_of(self, model: str, task: str) -> list[str]:
        if not self.s.head_race().racing:
            return []
        return [RACE_DECISION.format(model=model, task=task, checkpoint=c) for c in self.checkpoints(model, task)]

    def decisions(self) -> list[str]:
        """Every decision the race took (none under the grid): the tables say where it stopped."""
        return [path for m in self.s.models for t in self.s.tasks for path in self.decisions_of(m, t)]

    def decision_inputs(self, keys: Mapping) -> dict[str, list[str]]:
        """A checkpoint's race decision reads the heads of every fine-tuning seed there (checkpoint
        0's once) and the decision before it."""
        k = dict(keys)
        here = Checkpoint.named(k["checkpoint"])
        before = self.s.checkpoint_before(here)
        heads = [run.format(HEADS_DIR) for run in self.s.runs([k["task"]], [here]) if run.model == k["model"]]
        previous = [RACE_DECISION.format(model=k["model"], task=k["task"], checkpoint=before)] if before else []
        return {"heads": heads, "previous": previous}

    def survivors(self, pattern: str) -> Callable[[Mapping], list[str]]:
        """The input that makes a head job's race decided once per checkpoint: a fine-tuned
        checkpoint's heads under a later fine-tuning seed train only what the first seed's job
        there kept (its ``pattern``: the same directory under the first seed); nothing elsewhere."""

        def inputs(keys: Mapping) -> list[str]:
            k, first = dict(keys), self.s.ft_seeds[0]
            decided = self.s.head_race().racing and Checkpoint.named(k["checkpoint"]).fraction > 0
            if not decided or int(k["ftseed"]) == first:
                return []
            return [pattern.format(**{**k, "ftseed": first})]

        return inputs
