"""Entry point of the embedded model server process (see local.py).

It runs llama-cpp-python's OpenAI-compatible server in this process, and exits as soon
as the process that started it is gone (a killed kernel, a crashed script), so no
orphaned server is left holding a port and a core.
"""

import os
import runpy
import sys
import threading
import time


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def main() -> None:
    parent = int(os.environ.get("FLOWMAGIC_PARENT_PID", os.getppid()))
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    sys.argv = ["llama_cpp.server", *sys.argv[1:]]
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
