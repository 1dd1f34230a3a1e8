"""Which searched parameter goes where: training settings apply to every head, head options only
to head types that have them (bertvision.registry.heads). No optuna here, so that training with
a finished search's parameters does not import it."""

from __future__ import annotations

from bertvision.config.settings import HeadSettings
from bertvision.registry.heads import SEARCHABLE_TRAINING, searchable_parameters, searched_parameters


def applicable_space(space: dict, spec: dict) -> dict:
    """The part of the configured search space that applies to a head of ``spec['type']``."""
    return {name: space[name] for name in searched_parameters(space, spec["type"])}


def apply_params(head: HeadSettings, params: dict) -> HeadSettings:
    """``head`` with the searched ``params`` put in their places (a trial's, or in the final
    training a study's best): training settings, and the head type's options."""
    training = {k: v for k, v in params.items() if k in SEARCHABLE_TRAINING}
    options = {k: v for k, v in params.items() if k not in SEARCHABLE_TRAINING}
    return HeadSettings(spec={**head.spec, **options}, training=head.training.replace(**training))


def unsearched(head: HeadSettings, space: dict) -> HeadSettings:
    """``head`` with each key its search draws (``applicable_space``) at the space's first value (a
    range's low end): what a study's trials follow from, since every trial draws those keys, so
    that a change to them (heads.training.learning_rate, an adapter's width) reruns no search."""
    kinds = searchable_parameters()
    first = {
        name: dist["choices"][0] if "choices" in dist else kinds[name](dist["low"])
        for name, dist in applicable_space(space, head.spec).items()
    }
    return apply_params(head, first)
