"""The Python session inside a flow's sandbox: one interpreter whose names live from cell to cell.

Never imported by flowmagic: `session.py` runs this file (beside `sandbox_child.py`, whose
limits and keyring handling it loads) as `python -I -S -B -X utf8 session_child.py
config.json` under bubblewrap, or in a plain child process with sandbox="none". It uses the
standard library; pandas and matplotlib only where a cell has already imported them.

Processes. This first process, the anchor, sets the limits and forks the first holder, then
only reaps: bubblewrap ends the sandbox when its first child exits, and the holder changes.
The holder owns the session's names. It reads one request at a time (a 4-byte length, then
JSON) on fd 0 and answers on fd 1, both kept on private descriptors. A cell runs in a fork of
the holder: the fork runs the code, saves the open figures and lists the names it holds. When
the cell fails, times out or dies, the fork is discarded and the holder answers with its own
names, unchanged: a failed cell leaves nothing behind, as the exported notebook (which holds
only the cells that ran well) would not. When the cell succeeds, the holder answers and
exits, and the fork takes over as the holder, with the cell's names. The holder kills a
cell's process group at its deadline, so a timeout ends that cell and not the session; after
each cell, every process it started (setsid daemons too) is killed.
"""

import ast
import ctypes
import importlib.util
import json
import linecache
import os
import signal
import struct
import sys
import time
import traceback

_HERE = os.path.dirname(os.path.abspath(__file__))
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# the cell's stdout and stderr, on the sandbox's own /tmp (sandbox="none": its own folder)
_OUT = os.path.join(os.environ.get("TMPDIR") or "/tmp", ".flowmagic-cell")
_READ_MAX = 64 << 20               # a request larger than this is refused
_NAMES_MAX = 200                   # names listed after a cell
_COLUMNS_MAX = 60


def _base():
    """sandbox_child.py's limits and keyring handling (loaded by path: -I leaves the script's
    folder out of sys.path)."""
    spec = importlib.util.spec_from_file_location("_fm_sandbox_child",
                                                  os.path.join(_HERE, "sandbox_child.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- the channel
def _read_exact(fd, size):
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    size = struct.unpack(">I", head)[0]
    if size > _READ_MAX:
        return None
    body = _read_exact(fd, size)
    return None if body is None else json.loads(body.decode("utf-8"))


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _frame(obj):
    body = json.dumps(obj, ensure_ascii=False, default=str).encode("utf-8", "replace")
    return struct.pack(">I", len(body)) + body


# --------------------------------------------------------------------------- names
def _about_frame(value):
    columns = [str(c) for c in list(value.columns)[:_COLUMNS_MAX]]
    more = len(value.columns) - len(columns)
    text = f"{value.shape[0]} rows x {value.shape[1]} columns: " + ", ".join(columns)
    return text + (f" and {more} more" if more > 0 else ""), {
        "shape": list(value.shape), "columns": columns}


def _describe(value):
    """(type name, one line, machine fields) of one value; never raises."""
    kind = type(value)
    name, module = kind.__name__, kind.__module__ or ""
    if module == "builtins" and name == "module" or isinstance(value, type(sys)):
        return "module", value.__name__, {}
    if module.startswith("pandas") and name == "DataFrame":
        text, extra = _about_frame(value)
        return name, text, extra
    if module.startswith("pandas") and name == "Series":
        label = f", name {value.name!r}" if value.name is not None else ""
        return name, f"length {len(value)}, {value.dtype}{label}", {"length": len(value)}
    if module.startswith("numpy") and name == "ndarray":
        return name, f"shape {tuple(value.shape)}, {value.dtype}", {"shape": list(value.shape)}
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)) or (
            module.startswith("numpy") and hasattr(value, "item") and getattr(value, "ndim", 1) == 0):
        text = repr(value)
        text = text if len(text) <= 80 else text[:77] + "..."
        return name, text, {"value": text}
    if isinstance(value, dict):
        keys = ", ".join(repr(k)[:30] for k in list(value)[:8])
        return name, f"{len(value)} items" + (f"; keys {keys}" if keys else "")
        + (" ..." if len(value) > 8 else ""), {"length": len(value)}
    if isinstance(value, (list, tuple, set, frozenset)):
        return name, f"{len(value)} items", {"length": len(value)}
    if module.startswith("sklearn") and hasattr(value, "get_params"):
        fitted = any(k.endswith("_") and not k.startswith("_") for k in vars(value))
        return name, f"sklearn {name}, {'fitted' if fitted else 'not fitted'}", {}
    if callable(value):
        return ("class" if isinstance(value, type) else "function"), name, {}
    return name, f"{module}.{name}" if module and module != "builtins" else name, {}


def _names(ns):
    out = []
    first = {}   # id of an object -> the first name bound to it
    for key, value in list(ns.items()):
        if key.startswith("_") or len(out) >= _NAMES_MAX:
            continue
        try:
            kind, about, extra = _describe(value)
        except Exception as exc:  # noqa: BLE001 - a value whose attributes raise is still listed
            kind, about, extra = type(value).__name__, f"({type(exc).__name__} describing it)", {}
        if kind not in ("module", "function", "class") and "value" not in extra:
            if id(value) in first:   # `df = sales`: one table, listed once in prompts
                extra = {**extra, "same_as": first[id(value)]}
            first.setdefault(id(value), key)
        out.append({"name": key, "type": kind, "about": about, **extra})
    return out


# --------------------------------------------------------------------------- one cell
def _clip(path, limit):
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            if size <= limit * 4:
                data = fh.read()
            else:
                head = fh.read(limit * 2)
                fh.seek(size - limit * 2)
                data = head + b"\n[... output cut ...]\n" + fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


def _failing_line(exc, filename, source):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    if isinstance(exc, SyntaxError) and exc.filename == filename and exc.lineno:
        frames = [traceback.FrameSummary(filename, exc.lineno, "<module>")]
    if not frames:
        return None
    number = frames[-1].lineno or 0
    lines = source.splitlines()
    text = lines[number - 1].strip() if 0 < number <= len(lines) else ""
    return {"line": number, "text": text[:300]}


def _print_tb(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    text = "".join(traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc))
    print("Traceback (most recent call last):\n" + text, end="", file=sys.stderr)


def _quiet_show():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.show = lambda *args, **kwargs: None   # figures are saved after the cell instead


def _exec_cell(source, filename, ns):
    """Run the cell like a notebook does: its last bare expression's value is printed."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename, "exec")
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body.pop()
    exec(compile(tree, filename, "exec"), ns)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), filename, "eval"), ns)
        if value is not None and not (type(value).__module__ or "").startswith("matplotlib"):
            print(repr(value))


def _save_figures(prefix):
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or not prefix:
        return []
    saved = []
    for i, number in enumerate(plt.get_fignums()[:20], 1):   # (as answer_code._FIGURES_SAVED)
        name = f"{prefix}_{i}.png"
        plt.figure(number).savefig(name, dpi=90, bbox_inches="tight")
        saved.append(name)
    plt.close("all")
    return saved


def _run_in_fork(ns, req, limit):
    """In the cell's fork: run it, then the result as a dict."""
    source, filename = req["code"], req.get("file") or "cell.py"
    before = {n["name"]: (id(ns.get(n["name"])), n["about"]) for n in _names(ns)}
    started = time.monotonic()
    result = {"ok": False, "error_type": "", "error_line": None, "figures": []}
    _quiet_show()
    try:
        try:
            _exec_cell(source, filename, ns)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
        _quiet_show()
        result["figures"] = _save_figures(req.get("figures"))
        result["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - the cell's error is its result
        _print_tb(exc)
        result["error_type"] = type(exc).__name__
        result["error_line"] = _failing_line(exc, filename, source)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    result["duration_s"] = round(time.monotonic() - started, 4)
    result["stdout"] = _clip(f"{_OUT}/stdout", limit)
    result["stderr"] = _clip(f"{_OUT}/stderr", limit)
    if result["ok"]:
        result["names"] = _names(ns)
        result["defined"] = [n["name"] for n in result["names"]   # new, rebound or changed
                             if before.get(n["name"]) != (id(ns.get(n["name"])), n["about"])]
    return result


def _redirect_output():
    os.makedirs(_OUT, exist_ok=True)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        out = os.open(f"{_OUT}/{name}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)


def _set_cpu(seconds):
    import resource
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    soft = hard if seconds is None else (
        seconds if hard == resource.RLIM_INFINITY else min(seconds, hard))
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _collect(status_r, pid, deadline):
    """(the fork's status bytes, timed out) once it wrote them or died, or at the deadline."""
    import select
    data = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            return bytes(data), True
        if select.select([status_r], [], [], min(left, 1.0))[0]:
            chunk = os.read(status_r, 1 << 16)
            if not chunk:
                return bytes(data), False
            data.extend(chunk)


def _death(status):
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = str(number)
        return f"the cell's process was killed by {name} (a limit was hit)"
    return f"the code ended the interpreter (exit status {os.WEXITSTATUS(status)})"


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _sweep(keep):
    """Kill every process of the sandbox but `keep`, and wait (briefly) until they are gone:
    what a cell started (setsid daemons too) ends with the cell. Only in the sandbox's own
    pid namespace, where /proc shows nothing else."""
    killed = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in keep:
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
            except OSError:
                pass
    deadline = time.monotonic() + 2.0
    while killed and time.monotonic() < deadline:
        killed = [pid for pid in killed if _running(pid)]
        if killed:
            time.sleep(0.002)


class Holder:
    def __init__(self, requests, replies, config):
        self.requests, self.replies = requests, replies
        self.limit, self.workdir = int(config.get("output_limit") or 20000), config["workdir"]
        # bwrap's init and the anchor stay
        self.keep = {1, os.getppid()} if config.get("sweep") else None
        self.ns = {"__name__": "__main__", "__builtins__": __builtins__}

    def serve(self):
        import select
        idle = None
        while True:
            if idle and not select.select([self.requests], [], [], idle)[0]:
                os._exit(0)   # left idle: the host starts a new session when it needs one
            req = _read_frame(self.requests)
            if req is None:
                os._exit(0)   # the host closed the session
            idle = float(req.get("idle") or 0) or None
            if req.get("op") == "names":
                _write_all(self.replies, _frame({"ok": True, "names": _names(self.ns)}))
                continue
            self.cell(req)

    def cell(self, req):
        status_r, status_w = os.pipe()
        hand_r, hand_w = os.pipe()
        holder = os.getpid()
        pid = os.fork()
        if pid == 0:
            self._child(req, holder, status_r, status_w, hand_r, hand_w)
            return   # this process is the holder now
        os.close(status_w)
        os.close(hand_r)
        timeout = float(req.get("timeout") or 60.0)
        data, timed_out = _collect(status_r, pid, time.monotonic() + timeout)
        os.close(status_r)
        try:
            result = json.loads(data.decode("utf-8")) if data and not timed_out else None
        except ValueError:
            result = None
        if result is not None and result.get("ok"):
            self.sweep(pid)
            self._hand_over(req, result, pid, hand_w)
            return
        _, status = os.waitpid(pid, 0)
        os.close(hand_w)
        self.sweep()
        if result is None:
            result = {"ok": False, "error_type": "", "error_line": None, "figures": [],
                      "stdout": _clip(f"{_OUT}/stdout", self.limit),
                      "stderr": _clip(f"{_OUT}/stderr", self.limit)}
            result["error"] = (f"the code did not finish within {timeout:g} s and was stopped"
                               if timed_out else _death(status))
            result["output_bytes"] = max((os.path.getsize(f"{_OUT}/{name}")
                                          for name in ("stdout", "stderr")
                                          if os.path.exists(f"{_OUT}/{name}")), default=0)
        result.update(timed_out=timed_out, kept=False, names=_names(self.ns))
        _write_all(self.replies, _frame(result))

    def sweep(self, *also):
        if self.keep is not None:
            _sweep(self.keep | {os.getpid(), *also})

    def _hand_over(self, req, result, pid, hand_w):
        """The cell ran well: its fork takes over now, or, with `hold`, when the host says
        "keep" (a "drop" discards it, as a failure would)."""
        result.update(timed_out=False, kept=not req.get("hold"))
        _write_all(self.replies, _frame(result))
        if req.get("hold"):
            decision = _read_frame(self.requests)
            if not (decision and decision.get("op") == "keep"):
                os.close(hand_w)
                os.waitpid(pid, 0)
                if decision is None:
                    os._exit(0)
                _write_all(self.replies, _frame({"ok": True, "kept": False,
                                                 "names": _names(self.ns)}))
                return
        _write_all(hand_w, b"k")
        os._exit(0)   # the fork, with the cell's names, takes over

    def _child(self, req, holder, status_r, status_w, hand_r, hand_w):
        os.close(status_r)
        os.close(hand_w)
        os.setpgid(0, 0)   # the holder kills the cell's whole group at its deadline
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)   # dies with a holder that died
        if os.getppid() != holder:   # it died before the line above took effect
            os._exit(1)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        _redirect_output()
        os.chdir(self.workdir)
        _set_cpu(int(float(req.get("timeout") or 60.0)) + 1)
        result = _run_in_fork(self.ns, req, self.limit)
        libc.prctl(_PR_SET_PDEATHSIG, 0)   # the holder exits when this fork takes over
        _write_all(status_w, json.dumps(result, default=str).encode("utf-8", "replace"))
        os.close(status_w)
        if not result["ok"] or os.read(hand_r, 1) != b"k":
            os._exit(0)
        while os.read(hand_r, 1):   # end of file: the holder has exited
            pass
        os.close(hand_r)
        _set_cpu(None)
        if req.get("hold"):
            _write_all(self.replies, _frame({"ok": True, "kept": True}))


def main():
    with open(sys.argv[1], encoding="utf-8") as fh:
        config = json.load(fh)
    base = _base()
    base._leave_session_keyring()
    base._limit(config)
    os.makedirs(os.environ["HOME"], exist_ok=True)
    # each cell enters the workdir itself: as root it is the sandbox uid's only while a
    # cell runs (sandbox_process.SandboxProcess.lend)
    os.chdir("/")
    if config["site_dirs"]:
        import site
        for path in config["site_dirs"]:
            site.addsitedir(path)
    sys.argv = ["session"]
    requests, replies = os.dup(0), os.dup(1)   # private descriptors, closed on exec
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    # the holders that take over are orphans: they become this process's children
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    if os.fork() == 0:
        Holder(requests, replies, config).serve()
        os._exit(0)
    os.close(requests)
    os.close(replies)
    while True:   # the anchor: bubblewrap's first child stays, reaping what is orphaned
        try:
            os.wait()
        except ChildProcessError:
            os._exit(0)   # the holder is gone and nothing else runs: the session is over


main()
