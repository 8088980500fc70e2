"""Progress for the benchmarks: tqdm on a terminal; one line per 10% otherwise (logs and
CI stay readable)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class TenPercent:
    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.done, self.shown, self.t0 = (
            total,
            desc,
            0,
            0,
            time.perf_counter(),
        )

    def update(self, n: int = 1) -> None:
        self.done += n
        reached = min(10, self.done * 10 // self.total) if self.total else 0
        if reached > self.shown:  # one line, however many tenths this step crossed
            self.shown = reached
            rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
            print(
                f"{self.desc}: {self.shown * 10}% ({self.done:,}/{self.total:,}, {rate:,.1f}/s)",
                flush=True,
            )

    def __enter__(self) -> TenPercent:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def progress(total: int, desc: str, unit: str = "rollout") -> Any:
    """A bar to `update(n)`: tqdm on a terminal, TenPercent otherwise."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, unit_scale=True)
    return TenPercent(total, desc)


def track(items: Iterable[T], desc: str, unit: str = "batch") -> Iterator[T]:
    """Iterate with progress (a list or anything with len)."""
    items = list(items)
    with progress(len(items), desc, unit) as bar:
        for item in items:
            yield item
            bar.update(1)
