"""Record the tutorials on the embedded model, keeping every answer it gave.

    .venv/bin/python notebooks/record.py [--fresh] [NAME ...]   # default: every NN_*.ipynb

For each tutorial: an empty FLOWMAGIC_HOME and no endpoint from the environment; the
notebook's first cell loads NAME.cache.json (the answers recorded before; `--fresh`
empties it first, so every call really goes to the embedded model); nbclient runs the
notebook top to bottom and saves it with its outputs; then NAME.cache.json is rewritten
with exactly the answers this run used. So after a change that asks the model nothing
new (a print, a table's format) a run makes no call, and after a new cell only the new
calls go to the model.

The one-line notice printed when the embedded model starts is taken out of the outputs:
a replay from the cache never starts it. `make test` checks the tutorials with nbval
against these outputs, replaying the answers from the cache files (tests/test_tutorials.py).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENDPOINT_VARS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "FLOWMAGIC_BASE_URL",
                 "FLOWMAGIC_API_KEY", "FLOWMAGIC_MODEL")


def strip_notice(path: Path) -> None:
    import nbformat

    from flowmagic.ops.nbrun import NOTICE

    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        kept = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":   # the notice is on stdout (it was on stderr)
                out["text"] = "".join(line for line in out["text"].splitlines(keepends=True)
                                      if not line.startswith(NOTICE))
                if not out["text"]:
                    continue
            kept.append(out)
        if cell.cell_type == "code":
            cell.outputs = kept
    nbformat.write(nb, str(path))


def record(path: Path, fresh: bool = False) -> None:
    from flowmagic.ops.nbrun import execute
    from flowmagic.ops.export import save_cache
    from flowmagic.store import Store

    cache = path.with_suffix(".cache.json")
    if fresh or not cache.exists():
        cache.write_text("{}\n", encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="flowmagic-record-") as home:
        os.environ["FLOWMAGIC_HOME"] = home   # the kernel inherits it
        started = time.perf_counter()
        stats = execute(path, timeout=3600, progress=lambda line: print(f"  {line}", flush=True))
        store = Store(Path(home) / "flowmagic.db")
        kept = save_cache(cache, store=store)
        # A reply that could not be parsed is not cached, so a replay would ask again.
        failed = [c for c in store.recent_calls(10**6) if c["error"] and not c["cached"]]
        store.close()
    strip_notice(path)
    print(f"{path.name}: {stats['calls']} calls to the embedded model, {kept} answers kept, "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    if failed:
        print(f"{path.name}: {len(failed)} replies were not usable and are not cached "
              f"({failed[0]['error'][:120]}); the nbval check would call the model for them",
              flush=True)
    for line in stats["errors"]:
        print(f"{path.name}: flowmagic error in {line}", flush=True)


def main(args: list[str]) -> None:
    fresh = "--fresh" in args
    names = [a for a in args if a != "--fresh"]
    for var in ENDPOINT_VARS:
        os.environ.pop(var, None)
    os.environ["FLOWMAGIC_DISCOVER"] = "0"   # the embedded model, not a server found running
    paths = [HERE / f"{Path(n).stem}.ipynb" for n in names] or sorted(HERE.glob("[0-9][0-9]_*.ipynb"))
    for path in paths:
        record(path, fresh)


if __name__ == "__main__":
    main(sys.argv[1:])
