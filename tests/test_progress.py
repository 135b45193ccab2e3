"""Blocking calls show progress with tqdm.auto: a text bar in a terminal (a notebook gets the
widget bar); with stderr on no terminal (a pipe, a log) there is no bar."""

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

from conftest import ROOT

SCRIPT = ROOT / "tests" / "data" / "bar_map.py"


def run_in_a_terminal(env) -> str:
    leader, follower = pty.openpty()
    # a terminal 100 columns wide (a fresh pty says 0, and a bar fits nothing in 0 columns)
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, str(SCRIPT)], stdin=follower, stdout=follower,
                            stderr=follower, env=env, cwd=ROOT / "tests")
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:   # the terminal closed: the script ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")[-2000:]
    return b"".join(chunks).decode(errors="replace")


def test_map_and_importance_show_a_bar_in_a_terminal():
    text = run_in_a_terminal(dict(os.environ))
    assert "MAPPED 3" in text and "RANKED" in text
    assert "demo: map: 100%" in text and "3/3" in text
    assert "demo: importance:" in text and "configuration" in text


def test_no_bar_where_stderr_is_no_terminal():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT / "tests")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MAPPED 3" in done.stdout and "%|" not in done.stderr
