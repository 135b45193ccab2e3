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
    ([("engine/node_runner.py", "from flowmagic.flow import Flow")],
     "flowmagic.engine.node_runner -> flowmagic.flow"),
    # ops sits below the flow: it is handed a Flow and never imports it
    ([("ops/batch.py", "from flowmagic.flow import Flow")], "flowmagic.ops.batch -> flowmagic.flow"),
    ([("ops/replay.py", "from flowmagic.flow import Flow")],
     "flowmagic.ops.replay -> flowmagic.flow"),
    ([("ops/export.py", "from flowmagic.jupyter import replay_magics")],
     "flowmagic.ops.export -> flowmagic.jupyter.replay_magics"),
    # the door to a notebook's outputs is filled in by registration, never by an import up
    ([("_internal/outputs.py", "import flowmagic.jupyter")],
     "flowmagic._internal.outputs -> flowmagic.jupyter"),
    ([("model/plans.py", "from flowmagic.model.graph import Workflow")],
     "No cycles are allowed in flowmagic.model."),
], ids=["model-imports-flow", "view-imports-flow", "llm-imports-engine", "ops-imports-evaluate",
        "cycle-in-model", "runner-imports-flow", "batch-imports-flow", "replay-imports-flow",
        "export-imports-magics", "outputs-imports-jupyter", "plans-imports-graph"])
def test_an_upward_import_or_a_cycle_breaks_the_build(copy, edits, reported):
    for module, statement in edits:
        add_import(copy, module, statement)
    run = lint(copy)
    assert run.returncode != 0, run.stdout[-3000:]
    assert "BROKEN" in run.stdout
    assert reported in run.stdout, run.stdout[-3000:]


def _is_private(name):
    return name.startswith("_") and not name.startswith("__")


def _is_module(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:   # a name inside a module, not a submodule
        return False


def private_reach_ins(path, package):
    """`from <flowmagic module> import _name` and `<flowmagic module>._name` in one file
    (a private module such as `_internal` or `llm._server` may be imported; its names are
    what they export)."""
    tree = ast.parse(path.read_text())
    modules = set()   # local names bound to flowmagic modules
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names
                        if a.asname and a.name.split(".")[0] == "flowmagic"}
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) \
                if node.level else node.module
            if not base or base.split(".")[0] != "flowmagic":
                continue
            for a in node.names:
                if _is_module(f"{base}.{a.name}"):
                    modules.add(a.asname or a.name)
                elif _is_private(a.name):
                    yield f"{node.lineno}: from {base} import {a.name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and _is_private(node.attr)):
            yield f"{node.lineno}: {node.value.id}.{node.attr}"


def test_no_module_takes_a_private_name_of_another():
    """A name with a leading underscore belongs to its module: another module that needs it
    gets a public name (or the code moves)."""
    found = []
    for path in (ROOT / "flowmagic").rglob("*.py"):
        package = ".".join(path.relative_to(ROOT).parts[:-1])
        found += [f"{path.relative_to(ROOT)}:{hit}" for hit in private_reach_ins(path, package)]
    assert not found, "private names taken from another module:\n" + "\n".join(found)


def test_the_private_name_check_sees_a_reach_in(tmp_path):
    """The check above can fail: both forms of a reach-in, in a module of the package."""
    path = ROOT / "flowmagic" / "engine" / "node_runner.py"
    probe = tmp_path / "node_runner.py"
    probe.write_text(path.read_text() + "\nfrom ..model.similarity import _canon\n"
                     "from ..llm import endpoints as ep\nep._Endpoint = None\n")
    hits = list(private_reach_ins(probe, "flowmagic.engine"))
    assert any("import _canon" in h for h in hits), hits
    assert any("ep._Endpoint" in h for h in hits), hits


FRONT_ENDS = ("IPython", "ipywidgets")


def front_end_imports(path):
    """(line, module) of every import of IPython or ipywidgets in a file, lazy ones included."""
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [])
        for name in names:
            if name.split(".")[0] in FRONT_ENDS:
                yield node.lineno, name


def test_only_jupyter_and_the_cli_import_ipython_or_ipywidgets():
    """The layers below `jupyter/` reach a notebook through `_internal.outputs` (which
    `flowmagic.jupyter` fills in), never by importing IPython themselves."""
    found = []
    for path in (ROOT / "flowmagic").rglob("*.py"):
        where = path.relative_to(ROOT / "flowmagic")
        if where.parts[0] == "jupyter" or where == type(where)("cli.py"):
            continue
        found += [f"{where}:{line}: {name}" for line, name in front_end_imports(path)]
    assert not found, "IPython or ipywidgets imported outside jupyter/ and cli.py:\n" + \
        "\n".join(found)


def test_the_front_end_check_sees_a_lazy_import(tmp_path):
    probe = tmp_path / "render.py"
    probe.write_text("def f():\n    from IPython.display import display\n    import ipywidgets\n")
    assert [name for _, name in front_end_imports(probe)] == ["IPython.display", "ipywidgets"]


def imports_by_name(path):
    """(line, text) of every import of a flowmagic module that names it in a string:
    `importlib.import_module("flowmagic.x")`, `import_module(".x", __package__)` and
    `__import__(...)` of one of ours. The layer contracts cannot see such an import, so an
    arrow up could hide in one."""
    def ours(arg):
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value.startswith(("flowmagic", "."))
        if isinstance(arg, ast.JoinedStr):   # an f-string: its first literal part decides
            first = arg.values[0] if arg.values else None
            return not isinstance(first, ast.Constant) or str(first.value).startswith(
                ("flowmagic", "."))
        return False

    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else \
            node.func.id if isinstance(node.func, ast.Name) else ""
        if name not in ("import_module", "__import__"):
            continue
        names_package = len(node.args) > 1 or any(k.arg == "package" for k in node.keywords)
        if names_package or any(ours(a) for a in node.args[:1]):
            yield node.lineno, ast.unparse(node)


def test_no_module_imports_one_of_ours_by_name():
    """Every import of a flowmagic module is a plain import statement, so `lint-imports` sees
    every arrow: none goes up a layer unseen."""
    found = []
    for path in (ROOT / "flowmagic").rglob("*.py"):
        found += [f"{path.relative_to(ROOT)}:{line}: {text}"
                  for line, text in imports_by_name(path)]
    assert not found, "flowmagic modules imported by name, out of the contracts' sight:\n" + \
        "\n".join(found)


@pytest.mark.parametrize("source", [
    'import importlib\nimportlib.import_module("flowmagic.ops")\n',
    'import importlib\nimportlib.import_module(f"{__package__}.ops")\n',
    'from importlib import import_module\nimport_module(".jupyter", "flowmagic")\n',
    '__import__("flowmagic.flow")\n',
])
def test_the_by_name_check_sees_each_form(tmp_path, source):
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    assert list(imports_by_name(probe)), source


def test_the_by_name_check_leaves_other_packages_alone(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('import importlib\nimportlib.import_module("pandas")\n'
                     'importlib.import_module(name)\n__import__(gui)\n')
    assert not list(imports_by_name(probe))


def own_defs(cls):
    """The functions defined in a class's own body (each property getter and setter counted,
    dunders included; inherited ones not)."""
    import inspect
    import textwrap
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return [n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_the_flow_class_itself_stays_small():
    """`Flow` is its concerns put together (flowmagic/flow/: running, steering, readings,
    tools, operations); its own body holds what a Flow is, under 30 methods. A new method goes
    into the concern it belongs to, or a new one."""
    from flowmagic.flow import Flow
    defs = own_defs(Flow)
    assert len(defs) <= 29, f"Flow's own body has {len(defs)} defs: {defs}"
