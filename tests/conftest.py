from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERTVISION_SHARED_DATA", REPO.parent / "shared" / "data"))
SHIPPED_GLUE = REPO / "resources" / "glue"


def workflow_settings(**sections):
    """WorkflowSettings of a minimal config (the default backbone, MRPC from the shipped GLUE
    files) with ``sections`` replacing its top-level sections: the typed settings of every
    stage, with every default from the schema."""
    from bertvision.config.schema import validate_config
    from bertvision.config.workflow import WorkflowSettings
    from tests.tiny_bert import DEFAULT_BACKBONE

    config = {
        "backbones": {"m": {"pretrained": DEFAULT_BACKBONE}},
        "tasks": {"mrpc": None},
        "data": {"glue_dir": str(SHIPPED_GLUE), "squad_dir": str(REPO / "resources" / "squad2")},
        **sections,
    }
    return WorkflowSettings(validate_config(config))


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    from tests.tiny_bert import make_tiny_bert

    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def shared_glue() -> Path:
    path = SHARED_DATA / "glue"
    if not path.exists():
        pytest.skip(f"{path} not present (the shared benchmark data is not part of the project)")
    return path
