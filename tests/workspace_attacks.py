"""Issue 28 finding 5, played through a real Flow on a loopback model: model code goes after
the user's data (the input's copy, the user's files in a workdir, their modes, a planted
`pandas.py` and git hook). Each function sets its scene under `root`, runs the flow and
returns what a user would find afterwards, as JSON-able data.

tests/test_workspace_inputs.py calls them in its own process (root on CI) and, as root, once
more in a process of an unprivileged user (`python workspace_attacks.py NAME ROOT`), because
bubblewrap isolates those two differently.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys

PLAN = {"task": "Explore data.csv", "nodes": [
    {"id": "attack", "requirement": "Analyse the data.", "agent": "analyst"},
    {"id": "child", "requirement": "Analyse the data again.", "agent": "analyst"}],
    "edges": [["attack", "child"]]}
DATA = "x,y\n1,2\n3,4\n"
CHILD = "print(open('data.csv').read())"


def _flow(root: str, attack: str, data: str | None = None, **settings):
    import flowmagic
    from flowmagic.flow import Flow
    from flowmagic.testing.loopback import LoopbackServer

    def answer(body):
        text = "\n".join(m["content"] for m in body["messages"])
        node = (re.search(r"Your subtask \((\w+)\)", text) or [None, None])[1]
        return {"attack": attack, "child": f"```python\n{CHILD}\n```\n"}.get(node, "done")

    with LoopbackServer(responder=answer) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(PLAN, name="attacked", update="off", max_attempts=1,
                              starter="off", **settings)
        flow.add_inputs([data or os.path.join(root, "data.csv")])
        flow.run()
    return flow


def _read(path: str) -> str | None:
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return fh.read()


def _mode(path: str) -> str:
    return oct(stat.S_IMODE(os.lstat(path).st_mode))


def default_workspace(root: str) -> dict:
    """The input's copy in the run's own workspace: overwritten, chmod'ed, replaced by a
    FIFO; and a deliverable named like the input."""
    with open(os.path.join(root, "data.csv"), "w") as fh:
        fh.write(DATA)
    attack = ("```python\nimport os\n"
              "for step in (lambda: open('data.csv', 'w').write('CORRUPTED'),\n"
              "             lambda: os.chmod('data.csv', 0o666),\n"
              "             lambda: os.replace('data.csv', 'gone.csv'),\n"
              "             lambda: os.unlink('data.csv')):\n"
              "    try:\n        step()\n    except OSError as exc:\n        print(type(exc).__name__)\n"
              "```\n```text data.csv\nDELIVERABLE\n```\n")
    flow = _flow(root, attack)
    ws = flow.workspace
    nodes = flow.workflow.nodes
    return {"status": {n: nodes[n].status for n in nodes},
            "copy": (ws.root / "data.csv").read_text(),
            "copy_mode": _mode(str(ws.root / "data.csv")),
            "child_saw": (nodes["child"].execution or {}).get("stdout", ""),
            "saved": (nodes["attack"].execution or {}).get("saved"),
            "deliverable": _read(str(ws.root / "data-2.csv")),
            "said": nodes["attack"].output or ""}


def workdir_run(root: str) -> dict:
    """`workdir=` a folder of the user's: the input inside it, a private file, another file;
    the code goes at all of them by absolute path, and plants pandas.py and a git hook."""
    work = os.path.join(root, "project")
    os.makedirs(work)
    with open(os.path.join(work, "data.csv"), "w") as fh:
        fh.write(DATA)
    for name, text, mode in (("notes.txt", "private", 0o600), ("other.txt", "keep", 0o644)):
        path = os.path.join(work, name)
        with open(path, "w") as fh:
            fh.write(text)
        os.chmod(path, mode)
    attack = ("```python\nimport os\nW = %r\n"
              "steps = [lambda: open(W + '/data.csv', 'w').write('CORRUPTED'),\n"
              "         lambda: os.unlink(W + '/other.txt'),\n"
              "         lambda: os.chmod(W + '/notes.txt', 0o666),\n"
              "         lambda: open(W + '/pandas.py', 'w').write('raise SystemExit'),\n"
              "         lambda: os.makedirs(W + '/.git/hooks'),\n"
              "         lambda: open(W + '/.git/hooks/post-checkout', 'w').write('#!/bin/sh'),\n"
              "         lambda: open('out.csv', 'w').write('a,b'),\n"
              "         lambda: open('run.sh', 'w').write('#!/bin/sh'),\n"
              "         lambda: os.chmod('run.sh', 0o755)]\n"
              "for step in steps:\n    try:\n        step()\n"
              "    except OSError as exc:\n        print(type(exc).__name__)\n```\n") % work
    flow = _flow(root, attack, os.path.join(work, "data.csv"), workdir=work)
    ws = flow.workspace
    return {"status": flow.workflow.nodes["attack"].status,
            "listing": sorted(os.listdir(work)),
            "data": _read(os.path.join(work, "data.csv")),
            "notes_mode": _mode(os.path.join(work, "notes.txt")),
            "other": _read(os.path.join(work, "other.txt")),
            "run_folder": os.path.relpath(str(ws.root), work),
            "run_files": sorted(flow.files()),
            "run_sh_mode": _mode(str(ws.root / "run.sh")) if (ws.root / "run.sh").exists()
            else None,
            "child_saw": (flow.workflow.nodes["child"].execution or {}).get("stdout", "")}


if __name__ == "__main__":
    os.environ["FLOWMAGIC_DISCOVER"] = "0"
    os.environ["FLOWMAGIC_CHECK_MODELS"] = "0"
    name, where = sys.argv[1], sys.argv[2]
    os.environ["FLOWMAGIC_HOME"] = os.path.join(where, "home")
    out = globals()[name](where)
    print("RESULT " + json.dumps(out))
