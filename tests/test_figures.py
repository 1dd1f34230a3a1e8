"""Every figure in README.md and docs/*.md is in a file under docs/results (scripts/check_figures.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from tests.conftest import REPO


def checker():
    spec = importlib.util.spec_from_file_location("check_figures", REPO / "scripts" / "check_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_figure_the_docs_quote_is_in_a_results_file():
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "check_figures.py")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


def test_a_figure_no_results_file_holds_is_named_with_its_line(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "run.md").write_text("| lp | 0.895 ± 0.006 | 7 min 13 s | 6109.0 |\n")
    doc = tmp_path / "doc.md"
    doc.write_text("held: 0.895, 7 min 13 s and 6,109.0 (snakemake 9.27.1)\nnot held: 0.912 and 2 h 1 min\n")
    problems = checker().missing_figures([doc], results)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "0.912 is in no file under docs/results",
        "2 h 1 min is in no file under docs/results",
    ]
    assert all(":2:" in p for p in problems)
