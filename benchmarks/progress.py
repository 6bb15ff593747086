"""Progress for the long-running benchmark scripts: a tqdm bar on a terminal, plain lines in a log.

``tqdm`` comes with the ``bench`` extra (``pip install -e '.[bench]'``). When stderr is not a terminal (a log
file, CI), or tqdm is missing, progress is printed as whole lines (``desc: 3/12 (25%) 4.1s``) at most every
``every`` seconds and at the end, so a log stays readable.
"""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["progress"]


class _Lines:
    """Progress as plain lines on stderr."""

    def __init__(self, total: int, desc: str, every: float) -> None:
        self.total, self.desc, self.every = max(total, 1), desc, every
        self.n = 0
        self._t0 = self._last = time.monotonic()

    def update(self, k: int = 1) -> None:
        self.n += k
        now = time.monotonic()
        if self.n >= self.total or now - self._last >= self.every:
            self._last = now
            print(f"{self.desc}: {self.n}/{self.total} ({100 * self.n // self.total}%) {now - self._t0:.1f}s",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.n < self.total:
            print(f"{self.desc}: stopped at {self.n}/{self.total}", file=sys.stderr, flush=True)

    def __enter__(self) -> "_Lines":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(total: int, desc: str, every: float = 10.0) -> Any:
    """A progress counter with ``update(k)`` and ``close()``: tqdm on a terminal, :class:`_Lines` otherwise."""
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            return tqdm(total=total, desc=desc, file=sys.stderr, mininterval=0.5)
    return _Lines(total, desc, every)
