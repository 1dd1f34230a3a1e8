"""The house's drawing: the package's rooms (its top-level modules and folders) on floors, each
importing only rooms on its own floor or below (imports inside functions count too), with no
circle between rooms; the command layer on top, its every command one hop from its stage."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "bertvision"

# top to bottom: a room may import its own floor and the floors below
FLOORS = [
    {"commands", "__main__", "script_support"},
    {"stages"},
    {"serving"},
    {"reporting"},
    {"training", "peers"},
    {"features"},
    {"evaluation"},
    {"plan"},
    {"config", "runtime"},
    {"models"},
    {"data"},
    {"layout", "jobs", "registry"},
    {"files", "errors", "__init__"},
]
FLOOR = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def room_of(module: str) -> str:
    """The room of a dotted name under bertvision; a name of the package itself (``__version__``) is ``__init__``'s."""
    parts = module.split(".")
    room = parts[1] if len(parts) > 1 else "__init__"
    return room if (PACKAGE / room).is_dir() or (PACKAGE / f"{room}.py").is_file() else "__init__"


def imported_rooms(path: Path) -> set[str]:
    """The rooms of the package that ``path`` imports, wherever the import stands."""
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "bertvision":
            modules = [node.module] if node.module != "bertvision" else [f"bertvision.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names if a.name.split(".")[0] == "bertvision"]
        else:
            continue
        rooms.update(room_of(m) for m in modules)
    return rooms


def import_graph() -> dict[str, dict[str, list[str]]]:
    """room -> imported room -> the files that import it."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        room = relative.parts[0].removesuffix(".py")
        for target in imported_rooms(path) - {room}:
            graph[room][target].append(str(relative))
    return graph


def test_every_room_has_a_floor():
    rooms = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    assert rooms == set(FLOOR)


def test_no_import_runs_back_up():
    upward = [
        f"{room} -> {target} ({', '.join(files)})"
        for room, targets in import_graph().items()
        for target, files in targets.items()
        if FLOOR[target] < FLOOR[room]
    ]
    assert upward == []


def test_no_circle_between_rooms():
    graph = {room: set(targets) for room, targets in import_graph().items()}
    seen, on_path, circles = set(), [], []

    def visit(room):
        if room in on_path:
            circles.append(on_path[on_path.index(room) :] + [room])
            return
        if room in seen:
            return
        seen.add(room)
        on_path.append(room)
        for target in sorted(graph.get(room, ())):
            visit(target)
        on_path.pop()

    for room in sorted(graph):
        visit(room)
    assert circles == []


def test_every_flag_a_rule_passes_is_a_parameter_of_its_commands_stage():
    """Each rule's shell line against the parser its stage's signature makes: a renamed stage
    parameter, or a rule passing a flag no stage takes, fails here, not in a workflow job."""
    from bertvision.commands.main import command_parser

    checked = set()
    for rule_file in sorted((PACKAGE.parent / "rules").glob("*.smk")):
        for block in re.findall(r"shell:\n((?:\s+\".*\"\n)+)", rule_file.read_text()):
            (command,) = re.findall(r"bertvision\}? ([a-z-]+)", block)  # {params.bertvision}: a launcher
            options = {o for action in command_parser(command)._actions for o in action.option_strings}
            passed = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", block))
            assert passed <= options, (rule_file.name, command, passed - options)
            checked.add(command)
    assert len(checked) >= 20, checked


@pytest.mark.parametrize("lower", sorted(set(FLOOR) - FLOORS[0]))
def test_nothing_below_the_command_layer_imports_it(lower):
    assert "commands" not in import_graph().get(lower, {})
