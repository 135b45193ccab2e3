"""The one door to a workspace's files (engine/confined.py, used by Workspace): no symlink
followed, not even one swapped in between a check and a use; FIFOs and sockets refused at
once; every entry walked, however deep; bad names one line."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import pytest

from flowmagic.engine.workspace import Workspace
from flowmagic.errors import FlowError

@pytest.fixture(autouse=True)
def _deep_trees_removed(tmp_path):
    """pytest's own clean-up of old tmp folders recurses once a level: no deep tree is left."""
    yield
    subprocess.run(["rm", "-rf", str(tmp_path)], check=False)


pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ws(tmp_path):
    return Workspace(tmp_path / "ws")


def _nest(root, depth: int, leaf: str) -> str:
    fd = os.open(root, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        new = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = new
    os.close(os.open(leaf, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    os.close(fd)
    return "d/" * depth + leaf


def test_every_entry_is_walked_however_deep_and_no_link_is_entered(ws, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    deep = _nest(ws.root, 2000, "bottom.csv")
    os.symlink(outside, ws.root / "out")
    os.symlink(outside / "secret.txt", ws.root / "secret.txt")
    assert ws.files() == [deep]   # links are not files; the walk never entered `out`
    from flowmagic.engine import confined
    seen = {e.rel for e in confined.walk(ws.root)}
    assert "out" in seen and "secret.txt" in seen and "out/secret.txt" not in seen
    assert len([r for r in seen if r.startswith("d")]) == 2001


def test_a_fifo_a_socket_or_a_link_is_refused_at_once(ws, tmp_path):
    os.mkfifo(ws.root / "data.csv")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(ws.root / "s.png"))
    (tmp_path / "secret.png").write_bytes(b"\x89PNG secret")
    os.symlink(tmp_path / "secret.png", ws.root / "fig.png")
    for name, kind in (("data.csv", "a FIFO"), ("s.png", "a socket"),
                       ("fig.png", "symlink")):
        with pytest.raises(FlowError, match=kind):
            ws.read_bytes(name, 1 << 20)
    with pytest.raises(FlowError, match="FIFO"):
        ws.write("data.csv", "x")
    assert ws.files() == []


def test_a_read_is_bounded(ws):
    ws.write("big.png", b"x" * 5000)
    assert ws.read_bytes("big.png", 5000) == b"x" * 5000
    with pytest.raises(FlowError, match="5,000 bytes, over the 4,999"):
        ws.read_bytes("big.png", 4999)


@pytest.mark.parametrize("name, why", [
    ("x" * 300 + ".txt", "over 255 bytes"),
    ("/".join(["a"] * 2000) + ".txt", "levels deep"),
    ("../../evil.py", "leaves the workspace"),
    ("/etc/evil.py", "absolute"),
])
def test_a_bad_name_is_one_line(ws, name, why):
    """Finding 8: these raised OSError or RecursionError, which nothing caught."""
    with pytest.raises(FlowError, match=why) as info:
        ws.write(name, "x")
    assert "\n" not in str(info.value)


def test_a_folder_swapped_for_a_link_while_writing_creates_nothing_outside(ws, tmp_path):
    """Finding 6: the write resolved, checked, then wrote; a folder swapped for a symlink
    in between put folders outside the workspace."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws.root / "a").mkdir()
    stop = threading.Event()

    def swap():
        while not stop.is_set():
            try:
                os.rename(ws.root / "a", ws.root / "a.real")
                os.symlink(outside, ws.root / "a")
                time.sleep(0.0005)
                os.unlink(ws.root / "a")
                os.rename(ws.root / "a.real", ws.root / "a")
                time.sleep(0.0005)
            except OSError:
                pass

    thread = threading.Thread(target=swap)
    thread.start()
    try:
        for i in range(3000):
            try:
                ws.write(f"a/b{i}/c/out.txt", "x")
            except FlowError:
                pass
    finally:
        stop.set()
        thread.join()
    assert list(outside.iterdir()) == []   # (the old write made 17 folders there in 3,000)
