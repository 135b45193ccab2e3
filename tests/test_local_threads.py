"""The embedded server's thread count follows the machine (issue 31): on 2 idle cores two
llama.cpp threads evaluated csv_eda's prompts 1.7x faster than one, and beside one busy
process they never finished it. So each evaluation takes the cores the rest of the machine
left idle over the last second; FLOWMAGIC_LOCAL_THREADS fixes the count."""

import os
import subprocess
import sys
import time

import pytest

from flowmagic.errors import ConfigError
from flowmagic.llm import _server, local

linux = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc")


@pytest.mark.parametrize("others, cap, threads", [
    (0.0, 2, 2), (0.3, 2, 2), (0.6, 2, 1), (1.0, 2, 1), (3.0, 2, 1),
    (0.0, 4, 4), (1.2, 4, 3), (2.6, 4, 1), (0.0, 1, 1)])
def test_the_cores_left_idle_are_the_threads(others, cap, threads):
    assert _server.threads_for(others, cap) == threads


@linux
def test_a_busy_process_beside_the_server_takes_a_thread_away():
    cores = _server.Cores(2)
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)   # it has started
        for _ in range(2 * cores.WINDOW):
            time.sleep(cores.PERIOD)
            cores.sample()
    finally:
        burner.kill()
        burner.wait()
    assert cores.threads == 1


def _busy_jiffies() -> int:
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]


@linux
def test_this_process_own_work_is_not_counted_as_the_machine_busy():
    cores = _server.Cores(2)
    tick = os.sysconf("SC_CLK_TCK")
    busy, own, started = _busy_jiffies(), sum(os.times()[:2]), time.monotonic()
    for _ in range(2 * cores.WINDOW):   # busy here, in the process that samples
        end = time.monotonic() + cores.PERIOD
        while time.monotonic() < end:
            pass
        cores.sample()
    wall = time.monotonic() - started
    total = (_busy_jiffies() - busy) / tick / wall
    own = (sum(os.times()[:2]) - own) / wall
    others = sum(cores._window) / len(cores._window)
    assert own > 0.3 and abs(others - (total - own)) < 0.2, (others, total, own)


def test_the_thread_setting(monkeypatch):
    monkeypatch.setenv("FLOWMAGIC_LOCAL_THREADS", "3")
    assert local._threads() == (3, False)
    monkeypatch.delenv("FLOWMAGIC_LOCAL_THREADS")
    threads, adapt = local._threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    assert threads == max(1, min(cores, 4)) and adapt == (cores > 1)
    monkeypatch.setenv("FLOWMAGIC_LOCAL_THREADS", "0")
    with pytest.raises(ConfigError, match="FLOWMAGIC_LOCAL_THREADS='0' must be a whole number"):
        local._threads()
