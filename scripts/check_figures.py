"""Every figure the documentation quotes must be in a file under docs/results (issue 34): each
decimal number (0.925, 1.29, 6,109.0) and each duration (7 min 13 s, 2 h 7 min 28 s) in README.md
and docs/*.md is looked up in the text of docs/results/*.md, *.txt and *.csv. Version numbers
(9.27.1) are skipped; arithmetic the docs derive (a state's bytes) and other fixed numbers are
written out, with their derivation, in docs/results/derived-figures.txt, so they are in a file
too. Prints one line per figure found in no file and exits 1 if there is any.

    python scripts/check_figures.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/*.md")
RESULTS = "docs/results"
# decimals only (whole numbers in the docs are mostly settings: sizes, seeds, limits); not in a
# path or address (arxiv.org/abs/2202.12210) nor a version (9.27.1)
NUMBER = re.compile(r"(?<![\w.,/])(?:\d{1,3}(?:,\d{3})+|\d+)\.\d+(?![\d]|\.\d)")
DURATION = re.compile(r"\b\d+ h \d+ min(?: \d+ s)?|\b\d+ min \d+ s\b")


def figures(text: str) -> list[tuple[int, str]]:
    """(line, figure) for every decimal number and duration in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [(number, m.group()) for m in NUMBER.finditer(line)]
        found += [(number, m.group()) for m in DURATION.finditer(line)]
    return found


def corpus(results: Path) -> str:
    """The text of every results file, with thousands separators also dropped."""
    text = "\n".join(
        p.read_text(errors="ignore") for p in sorted(results.glob("*")) if p.suffix in (".md", ".txt", ".csv")
    )
    return text + "\n" + re.sub(r"(?<=\d),(?=\d{3})", "", text)


def missing_figures(documents: list[Path], results: Path) -> list[str]:
    held = corpus(results)
    problems = []
    for document in documents:
        for line, figure in figures(document.read_text()):
            if figure not in held and figure.replace(",", "") not in held:
                problems.append(f"{document.relative_to(REPO) if document.is_relative_to(REPO) else document}:{line}: "
                                f"{figure} is in no file under {RESULTS}")  # fmt: skip
    return problems


def main() -> int:
    documents = [p for pattern in DOCUMENTS for p in sorted(REPO.glob(pattern))]
    problems = missing_figures(documents, REPO / RESULTS)
    for problem in problems:
        print(problem)
    print(f"{len(problems)} figures in no results file ({len(documents)} documents read)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
