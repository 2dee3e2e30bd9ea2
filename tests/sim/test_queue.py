"""The wait queue: priority class, then FIFO; backfill may pass the head until the head is protected."""
from __future__ import annotations

from scheduler.sim.queue import JobQueue


def test_service_order_is_priority_then_arrival() -> None:
    q: JobQueue[str] = JobQueue()
    for name, prio, t in [("be1", 0, 0), ("ls1", 2, 1), ("be2", 0, 2), ("g1", 3, 3), ("ls2", 2, 4)]:
        q.push(name, priority=prio, now=t)
    assert [e.item for e in q.in_order()] == ["g1", "ls1", "ls2", "be1", "be2"]
    assert len(q) == 5 and q.head().item == "g1"


def test_entries_can_leave_from_the_middle_during_a_pass() -> None:
    q: JobQueue[str] = JobQueue()
    for i in range(4):
        q.push(f"j{i}", priority=0, now=i)
    taken = []
    for e in q.in_order():  # a backfill pass: j1 and j3 fit, j0 and j2 do not
        if e.item in ("j1", "j3"):
            q.remove(e)
            taken.append(e.item)
    assert taken == ["j1", "j3"]
    assert [e.item for e in q.in_order()] == ["j0", "j2"] and len(q) == 2


def test_head_is_protected_only_after_waiting_head_protect_seconds() -> None:
    q: JobQueue[str] = JobQueue(head_protect_s=100)
    q.push("big", priority=0, now=10)
    assert not q.head_is_protected(109)
    assert q.head_is_protected(110)
    q.push("urgent", priority=2, now=105)  # a higher class becomes the head; its own wait counts
    assert not q.head_is_protected(110)


def test_protection_off_never_protects() -> None:
    q: JobQueue[str] = JobQueue(head_protect_s=None)
    q.push("big", priority=0, now=0)
    assert not q.head_is_protected(1e12)
