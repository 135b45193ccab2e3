"""Progress bars of the blocking calls (map, trials, slim, importance): tqdm.auto, so a
notebook shows a widget bar and a terminal a text one; where stderr is no terminal (a pipe, a
log file, a test) there is none."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

__all__ = ["progress_bar", "ticking"]


@contextlib.contextmanager
def progress_bar(desc: str, total: int | None = None, unit: str = "it") -> Iterator[Any]:
    """A tqdm.auto bar for the length of the block, closed after it."""
    from tqdm.auto import tqdm
    bar = tqdm(total=total, desc=desc, unit=unit, disable=None)
    try:
        yield bar
    finally:
        bar.close()


def ticking(bar: Any, then: Callable[[Any], Any] | None,
            counts: Callable[[Any], bool] = lambda event: True) -> Callable[[Any], None]:
    """A progress callback that moves `bar` by one for each event `counts` says is a step,
    and hands every event on to `then`."""
    def tell(event: Any) -> None:
        if counts(event):
            bar.update(1)
        if then is not None:
            then(event)
    return tell
