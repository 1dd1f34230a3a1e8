"""Style is part of the fast tier: ruff's linter and its formatter (both configured in
pyproject.toml, at the version pinned in envs/requirements.txt) over the package, the tests and
the scripts, as `ruff check` and `ruff format --check` run them by hand."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

PATHS = ("bertvision", "tests", "scripts")


@pytest.mark.parametrize("command", [("check",), ("format", "--check")], ids=["check", "format"])
def test_ruff_finds_nothing(command):
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "--no-cache", *PATHS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (
        f"ruff {' '.join(command)} {' '.join(PATHS)}:\n{proc.stdout[-5000:]}{proc.stderr[-2000:]}"
    )
