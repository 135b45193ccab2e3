"""The first Python that runs inside a sandbox: limits, then the code, then its tests.

Never imported by flowmagic: `sandbox.py` runs this file as
`python -I -S -B -X utf8 sandbox_child.py config.json` (under bubblewrap, or in a plain child
process with sandbox="none"). It uses the standard library only. The limits it sets are
hard limits: the code cannot raise them again.
"""

import json
import os
import sys

TESTS_FAILED = 97   # the exit status when the code ran but a test failed (sandbox.TESTS_FAILED)
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "i686": 288, "armv7l": 311,
               "ppc64le": 271, "s390x": 280}
_KEYCTL_GET_KEYRING_ID, _KEYCTL_JOIN_SESSION_KEYRING, _SESSION_KEYRING = 0, 1, -3


def _leave_session_keyring() -> None:
    """Join a new, empty session keyring. The caller's session keyring is inherited across
    fork and stays readable by its possessor, whatever the uid or namespaces: a key that a
    credential helper keeps there would be the code's to read."""
    import ctypes
    import platform
    number = _SYS_KEYCTL.get(platform.machine())
    if number is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, _KEYCTL_JOIN_SESSION_KEYRING, None) >= 0:
        return
    # Refused: by the seccomp filter (or a kernel without keyrings), which refuses reading
    # keys as well. Make sure of it: the session keyring must be out of reach.
    if libc.syscall(number, _KEYCTL_GET_KEYRING_ID, ctypes.c_int(_SESSION_KEYRING), 0) >= 0:
        print("flowmagic sandbox: could not leave the caller's session keyring", file=sys.stderr)
        sys.exit(1)


def _limit(config: dict) -> None:
    import resource
    import signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a full file is an OSError, not a kill
    wanted = [(resource.RLIMIT_AS, config["memory_mb"] << 20),
              (resource.RLIMIT_FSIZE, config["file_limit_mb"] << 20),
              (resource.RLIMIT_NOFILE, config["max_open_files"]),
              (resource.RLIMIT_CORE, 0)]
    if config.get("cpu_s"):   # a session sets it per cell instead (session_child.py)
        wanted.append((resource.RLIMIT_CPU, config["cpu_s"]))
    if config.get("max_processes"):
        wanted.append((resource.RLIMIT_NPROC, config["max_processes"]))
    for kind, value in wanted:
        hard = resource.getrlimit(kind)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))


def _print_tb(exc: BaseException) -> None:
    import traceback
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    text = "".join(traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc))
    print("Traceback (most recent call last):\n" + text, end="", file=sys.stderr)


def _run(path: str, name: str, ns: dict) -> bool:
    with open(path, encoding="utf-8") as fh:
        src = fh.read()
    import linecache
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)   # source in tracebacks
    try:
        exec(compile(src, name, "exec"), ns)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    except BaseException as exc:
        _print_tb(exc)
        return False
    return True


def _run_tests(path: str, ns: dict) -> None:
    before = set(ns)
    failed = [] if _run(path, "tests.py", ns) else ["tests.py"]
    names = [k for k in ns if k not in before and k.startswith("test") and callable(ns[k])
             and getattr(getattr(ns[k], "__code__", None), "co_filename", "") == "tests.py"]
    for name in names:
        try:
            ns[name]()
        except BaseException as exc:
            print(f"FAILED {name}:", file=sys.stderr)
            _print_tb(exc)
            failed.append(name)
    if failed:
        print(f"flowmagic sandbox: {len(failed)} test(s) failed: {', '.join(failed)}",
              file=sys.stderr)
        sys.stdout.flush()
        sys.exit(TESTS_FAILED)


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as fh:
        config = json.load(fh)
    _leave_session_keyring()
    _limit(config)
    os.makedirs(os.environ["HOME"], exist_ok=True)
    os.chdir(config["workdir"])
    if config["site_dirs"]:
        import site
        for path in config["site_dirs"]:
            site.addsitedir(path)
    sys.argv = ["solution.py"]
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    if not _run(config["solution"], "solution.py", ns):
        sys.exit(1)
    if config["tests"]:
        _run_tests(config["tests"], ns)


if __name__ == "__main__":   # session_child.py loads this file for its limits
    main()
