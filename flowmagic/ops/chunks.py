"""How `flow.map(engine="dask")` cuts its inputs into Dask tasks.

Every task costs the scheduler, the driver and the worker a fixed amount (a graph update, a
submit, a result to carry, size and merge), so few large tasks are cheap; but a task returns
only when its last input is done, so large tasks at the end leave one worker busy while the
other waits, and they delay progress, resume and the budget. The cut is made as the tasks
are submitted (guided self-scheduling): each task takes a share of the inputs still left
(`1 / (SHARES * workers)`, so the tasks shrink towards the end and the workers finish
together), at most what one worker runs at once until the first results have measured how
long an input takes, then at most `TASK_S` seconds of one worker's work. With a budget the
tasks stay at what one worker runs at once: the budget is checked between tasks.

In flight: `WINDOW` tasks per worker, and at the end, when the tasks are small, still
`WINDOW` times what the workers run at once, so each worker has its next inputs waiting
on it while a finished task's result travels to the driver and the next task comes back.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Chunks", "Units", "TASK_S", "SHARES", "WINDOW"]

TASK_S = 2.0   # a task's expected time on its worker once an input's time is measured
SHARES = 3     # the inputs left are cut in at least this many tasks per worker
WINDOW = 3     # tasks in flight per worker: one runs, the next two are on their way


class Chunks:
    """The inputs not yet submitted, each (fingerprint, index, input); `take()` cuts the
    next task ("chunk", inputs), `learn()` is told each finished input's run time."""

    def __init__(self, todo: list[tuple], threads: int, workers: int, small: bool = False):
        self.todo, self.threads, self.workers, self.small = list(todo), threads, workers, small
        self._timed, self._seconds = 0, 0.0

    def __len__(self) -> int:
        return len(self.todo)

    def size(self) -> int:
        """How many inputs the next task takes."""
        most = self.threads
        if self._timed and not self.small:
            per_input = self._seconds / self._timed / self.threads   # inputs overlap
            most = max(most, int(TASK_S / max(per_input, 1e-3)))
        return max(1, min(most, -(-len(self.todo) // (SHARES * self.workers))))

    def take(self) -> tuple:
        size = self.size()
        chunk, self.todo = self.todo[:size], self.todo[size:]
        return ("chunk", chunk)

    def rest(self) -> list:
        rest, self.todo = self.todo, []
        return rest

    def room(self, in_flight: list[tuple]) -> bool:
        """Whether another task goes out now, with these tasks (("chunk", inputs)) out."""
        return (len(in_flight) < WINDOW * self.workers
                or sum(len(u[1]) for u in in_flight) < WINDOW * self.threads * self.workers)

    def learn(self, items: list[dict]) -> None:
        timed = [float(i["duration_s"]) for i in items if i.get("duration_s")]
        self._timed += len(timed)
        self._seconds += sum(timed)


class Units:
    """Units submitted as they are given (the partitions of a Dask DataFrame)."""

    def __init__(self, workers: int, units: list[tuple]):
        self.workers, self.units = workers, list(units)

    def __len__(self) -> int:
        return len(self.units)

    def take(self) -> tuple:
        return self.units.pop(0)

    def rest(self) -> list:
        rest, self.units = self.units, []
        return rest

    def room(self, in_flight: list[tuple]) -> bool:
        return len(in_flight) < WINDOW * self.workers

    def learn(self, items: list[Any]) -> None:
        """A partition is as large as it is."""
