"""The project's structure: no import cycles, every third-party import declared in pyproject.toml
(so `pip install .[...]` alone runs the workflow), every artifact folder ignored by git and
removed by `make clean`, and the layout's log and benchmark names for every rule."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import sys

import yaml

from bertvision import jobs, layout
from tests.conftest import REPO

PACKAGE = REPO / "bertvision"


def module_imports() -> dict[str, set[str]]:
    """Module name -> the bertvision modules and the top-level names it imports (anywhere in it)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                deps.add(base)
                deps.update(f"{base}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        out[name] = deps
    return out


def test_no_import_cycles():
    imports = module_imports()
    graph = {m: {d for d in deps if d in imports and d != m} for m, deps in imports.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d) :] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == []


def test_only_the_search_stage_imports_optuna():
    importers = {m for m, deps in module_imports().items() if any(d.split(".")[0] == "optuna" for d in deps)}
    assert importers == {"bertvision.stages.search"}


def declared_distributions() -> set[str]:
    """Distributions pyproject.toml declares: the dependencies and every extra."""
    requirements = importlib.metadata.requires("bertvision") or []
    names = {re.split(r"[\s;\[<>=!~]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}
    return names - {"bertvision"}


def test_every_third_party_import_is_declared():
    providers = importlib.metadata.packages_distributions()
    top_level = {d.split(".")[0] for deps in module_imports().values() for d in deps}
    third_party = top_level - set(sys.stdlib_module_names) - {"bertvision", "__future__"}
    missing = {}
    for module in sorted(third_party):
        dists = {d.lower().replace("_", "-") for d in providers.get(module, [module])}
        if not dists & declared_distributions():
            missing[module] = sorted(dists)
    assert missing == {}, f"imported but not in pyproject.toml: {missing}"


def test_the_default_backbone_package_is_declared():
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    for backbone in config["backbones"].values():
        package = backbone["pretrained"].removeprefix("python-package:").split("/")[0]
        dists = {d.lower() for d in importlib.metadata.packages_distributions()[package]}
        assert dists & declared_distributions()


def test_every_artifact_folder_is_ignored_by_git():
    ignored = {line.strip().strip("/") for line in (REPO / ".gitignore").read_text().splitlines()}
    assert set(layout.ROOTS) <= ignored
    templates = [v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str) and "/" in v]
    assert all(any(t.startswith(f"{root}/") for root in layout.ROOTS) for t in templates if not t.startswith("{"))


def test_every_rule_logs_where_the_layout_says():
    """Each rule's log (and benchmark, for the rules that have one) is the layout's, named by the
    rule's job keys, so the timing and cost tables find every benchmark from its keys."""
    text = "\n".join(p.read_text() for p in sorted((REPO / "rules").glob("*.smk")))
    bodies = dict(re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", text, flags=re.M | re.S))
    assert len(bodies) >= 14
    for rule, body in bodies.items():
        assert f'L.log("{rule}")' in body, rule
        if "benchmark:" in body:
            assert f'L.benchmark("{rule}")' in body, rule
        assert set(re.findall(r"{(\w+)}", layout.log(rule))) == set(layout.JOB_KEYS.get(rule, ())), rule
    for job in jobs.timing_jobs([layout.Run("m", "mrpc", 1, layout.Checkpoint(0.3))], n_shards=2):
        assert f'L.benchmark("{job.rule}")' in bodies[job.rule]
    job = jobs.Job("extract", {"task": "mrpc", "model": "m", "ftseed": 1, "checkpoint": "0.3", "shard": 0})
    assert job.benchmark == "benchmarks/extract/mrpc/m-ft1-ckpt-0.3-0.tsv"


def test_clean_removes_every_artifact_folder(tmp_path):
    import subprocess

    for root in layout.ROOTS:
        (tmp_path / root / "x").mkdir(parents=True)
    (tmp_path / "config.yaml").write_text("kept")
    subprocess.run(
        [sys.executable, "-m", "bertvision", "clean", "--dir", str(tmp_path)], check=True, capture_output=True
    )
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]
    # a user's own files beside the pipeline's in data/ (as docs/own-task.md lays them out) stay
    for root in layout.ROOTS:
        (tmp_path / root / "x").mkdir(parents=True)
    (tmp_path / "data" / "reviews-train.csv").write_text("text,label\n")
    subprocess.run([sys.executable, "-m", "bertvision", "clean", "--dir", str(tmp_path)], check=True)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "config.yaml", "data", "data/reviews-train.csv"
    ]  # fmt: skip


def test_clean_leaves_a_working_directory_that_held_only_artifacts(tmp_path):
    work = tmp_path / "work"
    (work / "models" / "x").mkdir(parents=True)
    layout.clean(str(work))
    assert work.is_dir() and not any(work.iterdir())  # the folder the person works in stays


def test_benchmark_files_name_their_rule_and_old_names_get_todays_checkpoint_spelling(tmp_path):
    from pathlib import Path

    for name in ("extract/mrpc/m-ft1-ckpt-0.3-0.tsv", "tables.tsv"):
        (tmp_path / "benchmarks" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "benchmarks" / name).write_text("s\n")
    assert [rule for rule, _ in layout.benchmark_files(tmp_path)] == ["extract", "tables"]
    old = Path("benchmarks/extract/mrpc/ckpt3-ft1-ckpt0.3-0.tsv")  # a backbone named ckpt3 keeps its name
    assert layout.current_benchmark_name(old) == old.with_name("ckpt3-ft1-ckpt-0.3-0.tsv")


def test_each_kind_of_shared_encoder_reads_its_weights_where_they_were_trained():
    from bertvision.layout import Checkpoint, SharedEncoder

    frozen = SharedEncoder("f", "frozen", checkpoint=Checkpoint(0), first_ftseed=1)
    own = SharedEncoder("o", "task", source="sst2", checkpoint=Checkpoint(1), first_ftseed=1)
    mixture = SharedEncoder("mix", "mixture", tasks=("sst2", "mrpc"))
    assert frozen.checkpoint_dir("m", 2, "mrpc") == "models/m/mrpc/ft1/ckpt-0"  # the first seed's untouched encoder
    assert own.checkpoint_dir("m", 2, "mrpc") == "models/m/sst2/ft2/ckpt-1"  # its source's run, whatever the task
    assert mixture.checkpoint_dir("m", 2, "mrpc") == "shared/m/mix/ft2/encoder"
    # what their states' records name as the checkpoint: the run's, a mixture's kind
    assert (frozen.checkpoint_name, own.checkpoint_name, mixture.checkpoint_name) == ("0", "1", "mixture")
    for encoder in (frozen, own, mixture):  # as the rules pass them: through JSON, where a tuple is a list
        assert SharedEncoder.from_json(json.loads(json.dumps(encoder.to_json()))) == encoder


def test_head_runs_come_in_a_stable_order_whatever_the_folders_order(tmp_path):
    heads = [(name, seed) for name in ("mlp", "lp", "cnn", "attn", "lp-l2") for seed in (3, 1, 2)]
    for name, seed in heads:  # made out of order: a folder's listing order is the filesystem's
        run = layout.head_run_dir(tmp_path, name, seed)
        run.mkdir(parents=True)
        (run / layout.HEAD_METRICS).write_text("{}")
    assert layout.head_runs(tmp_path) == sorted(layout.head_run_dir(tmp_path, n, s) for n, s in heads)


def test_every_config_key_is_documented():
    """The schema is the documentation of every key: each leaf has a description."""
    from bertvision.config.schema import load_schema

    schema = load_schema()
    undocumented = []

    def resolve(node):
        ref = node.get("$ref") or (node.get("allOf") or [{}])[0].get("$ref")
        return schema["$defs"][ref.split("/")[-1]] if ref and "properties" not in node else node

    def has_children(node):
        extra = node.get("additionalProperties")
        return "properties" in node or (isinstance(extra, dict) and "properties" in extra)

    def walk(node, path):
        for key, sub in node.get("properties", {}).items():
            if "x-registry" in sub:
                continue
            if has_children(resolve(sub)):
                walk(resolve(sub), f"{path}{key}.")
            elif "description" not in sub:
                undocumented.append(f"{path}{key}")
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and "properties" in extra:
            walk(extra, f"{path}<name>.")

    walk(schema, "")
    assert undocumented == []


def test_the_readme_commands_are_make_targets_and_ci_runs_the_tests():
    readme = (REPO / "README.md").read_text()
    assert "make run" in readme and "make test" in readme
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^run: setup$", makefile, re.M) and re.search(r"^test: setup$", makefile, re.M)
    # `make test` is the fast tier; `make test-all` (every tier) is what CI runs
    assert re.search(r"^PYTEST = \$\(PY\) -m pytest ", makefile, re.M)
    assert re.search(r'^test: setup\n\t\$\(PYTEST\) -m "not slow and not slurm"$', makefile, re.M)
    assert re.search(r"^test-all: setup\n\t\$\(PYTEST\) --durations=25$", makefile, re.M)
    assert re.search(r"^make test-all$", (REPO / ".ci" / "run").read_text(), re.M)
