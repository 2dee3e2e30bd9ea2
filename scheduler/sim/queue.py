"""The wait queue: priority class first (higher first), then FIFO by arrival, with backfill.

Backfill: a scheduling pass walks the queue in that order and starts every job that fits, so a later,
smaller job may start while a large one ahead of it still waits. Pure greedy backfill can starve a large
job for ever (small jobs keep taking each GPU as it frees), so the head is protected: once the head has
waited `head_protect_s` seconds, the pass stops at the head until it starts (nothing behind it may take
the capacity it is waiting for). `head_protect_s=None` turns protection off.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


@dataclass
class Queued(Generic[T]):
    item: T
    priority: int
    enqueued_at: float
    seq: int = 0


@dataclass
class JobQueue(Generic[T]):
    head_protect_s: float | None = None
    # One insertion-ordered dict per priority: FIFO within a class, O(1) removal from the middle (backfill).
    _classes: dict[int, dict[int, Queued[T]]] = field(default_factory=dict)
    _seq: int = 0
    _len: int = 0

    def push(self, item: T, *, priority: int, now: float) -> Queued[T]:
        self._seq += 1
        entry = Queued(item, priority, now, self._seq)
        self._classes.setdefault(priority, {})[self._seq] = entry
        self._len += 1
        return entry

    def remove(self, entry: Queued[T]) -> None:
        del self._classes[entry.priority][entry.seq]
        self._len -= 1

    def __len__(self) -> int:
        return self._len

    def in_order(self) -> Iterator[Queued[T]]:
        """Entries in service order; safe against `remove` of the entry just yielded."""
        for priority in sorted(self._classes, reverse=True):
            for entry in list(self._classes[priority].values()):
                yield entry

    def head(self) -> Queued[T] | None:
        return next(self.in_order(), None)

    def head_is_protected(self, now: float) -> bool:
        """True when the head has waited long enough that nothing may pass it."""
        if self.head_protect_s is None:
            return False
        head = self.head()
        return head is not None and now - head.enqueued_at >= self.head_protect_s
