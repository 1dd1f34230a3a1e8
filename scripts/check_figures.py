"""Every figure the documentation quotes must be in the results file its sentence names (issue 47).

Each decimal number (0.925, 1.29, 6,109.0) and each duration (7 min 13 s, 2 h 7 min 28 s) in
README.md and docs/*.md is looked up, as a whole number, in the files under docs/results that its
own sentence names: the paragraph, list item or table row it stands in, with a list's lead-in
paragraph and a table's caption (the paragraph right before or after it). A figure whose sentence
names no results file fails, and so does a link to a results file that does not exist. Version
numbers (9.27.1) and YAML blocks (settings) are skipped; arithmetic the docs derive and other
fixed numbers are written out, with their derivation, in docs/results/derived-figures.txt, which
the sentence then names.
Prints one line per figure not held and exits 1 if there is any.

    python scripts/check_figures.py
"""

from __future__ import annotations

import argparse
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from bertvision.script_support import run_script

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/*.md")
RESULTS = "docs/results"
# decimals only (whole numbers in the docs are mostly settings: sizes, seeds, limits), with a sign
# where written (-1.7, +2.8), or none before the point (.5337); not in a path or address
# (arxiv.org/abs/2202.12210) nor a version (9.27.1)
NUMBER = re.compile(r"(?<![\w.,/])[-−+]?(?:\d{1,3}(?:,\d{3})+|\d+)?\.\d+(?![\d]|\.\d)(?:×|x\b)?")
SPREAD = re.compile(rf"{NUMBER.pattern} ± {NUMBER.pattern}")
# an interval's two ends with their signs (-0.2 to +2.1), as the summaries write a bootstrap's
INTERVAL = re.compile(rf"[+-]{NUMBER.pattern} to [+-]{NUMBER.pattern}")
DURATION = re.compile(r"\b\d+ h \d+ min(?: \d+ s)?|\b\d+ min \d+ s\b")
FILE_NAME = re.compile(r"[\w./{},-]*\.(?:md|txt|csv|png)")
# a link or a path that says it is under docs/results, so it must exist there
RESULTS_PATH = re.compile(r"(?:\]\(|`|\b)(?:docs/)?results/([\w.{},-]+\.(?:md|txt|csv|png))")
# names and settings, not measurements: SQuAD 2.0, Python 3.11, an arXiv number (2202.12210), a
# checkpoint's epoch fraction (0.3 epochs, 0.3-epoch, ckpt-0.3, adapter64@0.3)
NOT_FIGURES = re.compile(
    r"SQuAD[ -]?2\.0|Python (?:≥ )?\d+\.\d+|\b\d{4}\.\d{5}\b"
    r"|\b\d+(?:\.\d+)?[- ]epochs?\b|ckpt-?\d+(?:\.\d+)?|@\d+(?:\.\d+)?"
)
# files under docs/results that are not a run's output, so no figure may rest on them
NOT_RESULTS = {"README.md", "HISTORY.md"}
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3})")


def figures(text: str) -> list[tuple[int, str]]:
    """(line, figure) for every decimal number and duration in ``text``; a mean and its spread
    (0.831 ± 0.014), and an interval's two ends (-0.2 to +2.1), are one figure, to be found together."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        line = NOT_FIGURES.sub(" ", line)
        spreads = [*SPREAD.finditer(line), *INTERVAL.finditer(line)]
        inside = [range(m.start(), m.end()) for m in spreads]
        found += [(number, m.group()) for m in spreads]
        found += [(number, m.group()) for m in NUMBER.finditer(line) if not any(m.start() in r for r in inside)]
        found += [(number, m.group()) for m in DURATION.finditer(line)]
    return found


def expand(name: str) -> list[str]:
    """``default-{summary,timing}.md`` -> both names; a path -> its file name."""
    name = name.rsplit("/", 1)[-1]
    braces = re.search(r"\{([^}]*)\}", name)
    if not braces:
        return [name]
    return [
        full
        for alternative in braces.group(1).split(",")
        for full in expand(name[: braces.start()] + alternative + name[braces.end() :])
    ]


@dataclass
class Unit:
    """A paragraph, list item or table row: its first line, its text, and the text whose cited
    files its figures may come from."""

    line: int
    text: str
    context: str


def blocks(text: str) -> list[tuple[int, list[str]]]:
    """(first line, lines) of each block: paragraphs, lists and tables split by blank lines,
    a fenced code block whole, each heading alone."""
    found: list[tuple[int, list[str]]] = []
    current: list[str] = []
    start = 1
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and (not line.strip() or line.startswith("#")):
            if current:
                found.append((start, current))
                current = []
            if line.startswith("#"):
                found.append((number, [line]))
            continue
        if not current:
            start = number
        current.append(line)
    if current:
        found.append((start, current))
    return found


ITEM = re.compile(r"\s{0,3}(?:[-*]|\d+\.)\s")


def units(text: str) -> list[Unit]:
    every = blocks(text)
    found = []
    for index, (start, lines) in enumerate(every):
        before = "\n".join(every[index - 1][1]) if index and not every[index - 1][1][0].startswith("#") else ""
        after = "\n".join(every[index + 1][1]) if index + 1 < len(every) else ""
        if lines[0].startswith(("```yaml", "```yml")):
            continue  # a config: settings, not measurements
        if lines[0].startswith("|"):
            found += [Unit(start + i, row, "\n".join((row, before, after))) for i, row in enumerate(lines)]
        elif ITEM.match(lines[0]):
            items: list[tuple[int, list[str]]] = []
            for i, line in enumerate(lines):
                if ITEM.match(line) or not items:
                    items.append((start + i, []))
                items[-1][1].append(line)
            found += [Unit(first, "\n".join(item), "\n".join((*item, before))) for first, item in items]
        else:
            block = "\n".join(lines)
            found.append(Unit(start, block, block))
    return found


@functools.cache
def results_held(results: Path) -> frozenset[str]:
    return frozenset(p.name for p in results.iterdir() if p.name not in NOT_RESULTS)


def cited(text: str, results: Path) -> tuple[set[str], set[str]]:
    """(files under ``results`` the text names, names it gives as under docs/results that are not)."""
    held = results_held(results)
    named = {name for token in FILE_NAME.findall(text) for name in expand(token)}
    missing = {
        name for match in RESULTS_PATH.finditer(text) for name in expand(match.group(1)) if name not in held
    } - NOT_RESULTS
    return named & held, missing


def holds(body: str, figure: str) -> bool:
    """``figure`` in ``body`` as a whole number; a ratio's sign (0.57× or 0.57x) must be there too,
    and a figure's own sign: a minus found with one, a plus not with a minus (an unsigned figure, a
    difference's size, may be either); a figure written without its leading zero (.53, as the
    original paper writes) found with or without it."""
    sign, digits = re.fullmatch(r"([-−+]?)(.*)", figure, re.S).groups()
    plain = re.sub("[×x]$", "[×x]", re.escape(THOUSANDS.sub("", digits)))
    plain = re.sub(r"^0?\\\.", r"0?\\.", plain)  # .53 and 0.53 are one figure
    before = {"": r"(?<![\d.])", "+": r"(?<![\d.\-−])", "-": "[-−]", "−": "[-−]"}[sign]
    return re.search(rf"{before}{plain}(?!\d)", body) is not None


@functools.cache
def normalized(path: Path) -> str:
    if path.suffix in (".png", ".csv"):  # a CSV's commas part its fields: 0.912,100 is two numbers
        return "" if path.suffix == ".png" else path.read_text(errors="ignore")
    return THOUSANDS.sub("", path.read_text(errors="ignore"))


def problems_in(document: Path, results: Path) -> list[str]:
    name = document.relative_to(REPO) if document.is_relative_to(REPO) else document
    problems = []
    for unit in units(document.read_text()):
        files = cited(unit.context, results)[0]
        missing = cited(unit.text, results)[1]
        problems += [f"{name}:{unit.line}: names {file}, which is not in {RESULTS}" for file in sorted(missing)]
        for offset, figure in figures(unit.text):
            where = f"{name}:{unit.line + offset - 1}: {figure}"
            if not files:
                problems.append(f"{where}: its sentence names no file under {RESULTS}")
                continue
            if not any(holds(normalized(results / file), figure) for file in files):
                problems.append(f"{where} is not in {', '.join(sorted(files))}")
    return problems


def missing_figures(documents: list[Path], results: Path) -> list[str]:
    return [problem for document in documents for problem in problems_in(document, results)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    documents = [p for pattern in DOCUMENTS for p in sorted(REPO.glob(pattern))]
    problems = missing_figures(documents, REPO / RESULTS)
    for problem in problems:
        print(problem)
    print(f"{len(problems)} figures not in the results file their sentence names ({len(documents)} documents read)")
    return 1 if problems else 0


if __name__ == "__main__":
    run_script(main)
