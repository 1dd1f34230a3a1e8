from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERTVISION_SHARED_DATA", REPO.parent / "shared" / "data"))
SHIPPED_GLUE = REPO / "resources" / "glue"


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
