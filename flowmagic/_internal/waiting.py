"""Waiting until a descriptor can be read, whatever its number.

select() takes only descriptors below FD_SETSIZE (1024): a process that holds many files
(a long-lived kernel, a test session) is handed higher numbers, and select() then raises
ValueError. poll() takes any descriptor, in whole milliseconds; below the limit select() is
kept for its finer timeouts.
"""

from __future__ import annotations

import math
import select

__all__ = ["readable"]

_FD_SETSIZE = 1024


def readable(fd: int, timeout: float | None) -> bool:
    """Whether `fd` can be read (data, end of file or an error) within `timeout` seconds
    (None: wait as long as it takes; 0: look without waiting)."""
    if fd < _FD_SETSIZE:
        return bool(select.select([fd], [], [], timeout)[0])
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000))))
