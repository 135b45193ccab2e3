"""The import-linter contracts in pyproject.toml are active: they pass on the tree and fail on
an upward import or a cycle inside a folder, added to a temporary copy of the package."""

import ast
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

LINT = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def lint(cwd):
    env = {**os.environ, "PYTHONPATH": str(cwd)}   # the copy, not the installed package
    return subprocess.run([LINT, "--no-logo", "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def copy(tmp_path):
    shutil.copytree(ROOT / "flowmagic", tmp_path / "flowmagic",
                    ignore=shutil.ignore_patterns("__pycache__", "templates"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def add_import(root, module, statement):
    path = root / "flowmagic" / module
    path.write_text(path.read_text() + f"\n{statement}  # added by test_layers\n")


def imported_names(path, package):
    """(line, module, names) of every `from ... import ...` in a file, lazy ones included."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) \
                if node.level else node.module
            if base and base.split(".")[0] == "flowmagic":
                yield node.lineno, base, [a.name for a in node.names]


def test_every_import_of_a_flowmagic_module_names_one_that_exists():
    """Imports inside functions run late; one left on a pre-move path fails here at once."""
    missing = []
    files = [(p, ".".join(p.relative_to(ROOT).with_suffix("").parts[:-1]))
             for p in (ROOT / "flowmagic").rglob("*.py")]
    files += [(p, "") for p in [*(ROOT / "tests").glob("*.py"), *(ROOT / "bench").glob("*.py")]]
    for path, package in files:
        if path.name == "__init__.py":
            package = ".".join(path.relative_to(ROOT).parts[:-1])
        for line, module, names in imported_names(path, package):
            found = importlib.import_module(module) if importlib.util.find_spec(module) else None
            for name in names:
                if found is None or not (hasattr(found, name) or name == "*"
                                         or importlib.util.find_spec(f"{module}.{name}")):
                    missing.append(f"{path.relative_to(ROOT)}:{line}: {module} {name}")
    assert not missing, "imports of names that do not exist (see README, Development):\n" + \
        "\n".join(missing)


def test_the_contracts_hold_on_the_tree():
    run = lint(ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_the_contracts_hold_on_an_unchanged_copy(copy):
    run = lint(copy)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


@pytest.mark.parametrize("edits, reported", [
    ([("model/graph.py", "import flowmagic.flow")], "flowmagic.model.graph -> flowmagic.flow"),
    ([("view/render.py", "from flowmagic.flow import Flow")],
     "flowmagic.view.render -> flowmagic.flow"),
    ([("llm/client.py", "from flowmagic.engine import planner")],
     "flowmagic.llm.client -> flowmagic.engine.planner"),
    # siblings of one layer stay independent
    ([("ops/batch.py", "from flowmagic.evaluate import scoring")],
     "flowmagic.ops.batch -> flowmagic.evaluate.scoring"),
    # a cycle between two modules of one folder
    ([("model/metrics.py", "from flowmagic.model import merge"),
      ("model/merge.py", "from flowmagic.model import metrics")],
     "No cycles are allowed in flowmagic.model."),
    # the stage-1 exceptions are gone: each of those imports, added back, breaks the build
    ([("engine/runner.py", "from flowmagic.flow import Flow")],
     "flowmagic.engine.runner -> flowmagic.flow"),
    ([("flow.py", "from flowmagic.ops import batch")], "flowmagic.flow -> flowmagic.ops.batch"),
    ([("flow.py", "from flowmagic.ops import slimming")],
     "flowmagic.flow -> flowmagic.ops.slimming"),
    ([("flow.py", "from flowmagic.ops.export import export")],
     "flowmagic.flow -> flowmagic.ops.export"),
    ([("model/plans.py", "from flowmagic.model.graph import Workflow")],
     "No cycles are allowed in flowmagic.model."),
], ids=["model-imports-flow", "view-imports-flow", "llm-imports-engine", "ops-imports-evaluate",
        "cycle-in-model", "runner-imports-flow", "flow-imports-batch", "flow-imports-slimming",
        "flow-imports-export", "plans-imports-graph"])
def test_an_upward_import_or_a_cycle_breaks_the_build(copy, edits, reported):
    for module, statement in edits:
        add_import(copy, module, statement)
    run = lint(copy)
    assert run.returncode != 0, run.stdout[-3000:]
    assert "BROKEN" in run.stdout
    assert reported in run.stdout, run.stdout[-3000:]
