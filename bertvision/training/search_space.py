"""Which searched parameter goes where: training settings apply to every head, head options only
to head types that have them (bertvision.registry.heads). No optuna here, so that training with
a finished search's parameters does not import it."""

from __future__ import annotations

from bertvision.config.settings import HeadTrainingSettings
from bertvision.registry.heads import SEARCHABLE_TRAINING, get_head_type


def applicable_space(space: dict, spec: dict) -> dict:
    """The part of the configured search space that applies to a head of ``spec['type']``."""
    options = get_head_type(spec["type"]).options
    return {name: dist for name, dist in space.items() if name in SEARCHABLE_TRAINING or name in options}


def apply_params(spec: dict, settings: HeadTrainingSettings, params: dict) -> tuple[dict, HeadTrainingSettings]:
    """(head spec, training settings) with the searched ``params`` put in their places."""
    training = {k: v for k, v in params.items() if k in SEARCHABLE_TRAINING}
    return {**spec, **{k: v for k, v in params.items() if k not in SEARCHABLE_TRAINING}}, settings.replace(**training)


def own_training(spec: dict, settings: HeadTrainingSettings) -> tuple[dict, HeadTrainingSettings]:
    """(head spec, training settings) of a configured head: its ``training`` overrides (e.g. fewer
    epochs for a costly head) replace the task's settings, and leave the spec."""
    own = spec.get("training") or {}
    return {k: v for k, v in spec.items() if k != "training"}, settings.replace(**own)
