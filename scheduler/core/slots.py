"""Which memory slices a slice, a hold or a reserved window occupies on one GPU: the one `Slots` value.

A MIG instance holds `memory_slices` consecutive memory slices from its start (mig.py). A whole GPU holds
all of them: for a MIG GPU that is its full profile at 0 (0..8 on an A100); a GPU that is not split (no MIG,
or MIG off) is one indivisible unit, written as every slot any GPU has (`Slots.whole()`), so that it overlaps
whatever else is ever put on it. Reserved windows store these numbers (slot_start, slot_end) and PostgreSQL's
exclusion constraint compares them as int4range, so the convention lives here and nowhere else.
"""
from __future__ import annotations

from dataclasses import dataclass

from nodeagent.hardware.mig import MigGeometry

ALL_SLOTS = 64  # more memory slices than any GPU has (8 on A100/H100/H200, 4 on A30)


@dataclass(frozen=True, order=True)
class Slots:
    """Memory slices [start, end) of one GPU."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not (0 <= self.start < self.end <= ALL_SLOTS):
            raise ValueError(f"slots [{self.start}, {self.end}) are not within [0, {ALL_SLOTS})")

    @classmethod
    def whole(cls) -> "Slots":
        """A GPU that is not split: it overlaps every slot."""
        return cls(0, ALL_SLOTS)

    @classmethod
    def of(cls, geometry: MigGeometry | None, profile: str | None, start: int = 0) -> "Slots":
        """What `profile` at `start` holds on a GPU of `geometry`; no geometry or no profile: the whole GPU."""
        if geometry is None or not profile:
            return cls.whole()
        return cls(start, start + geometry.profile(profile).memory_slices)

    @classmethod
    def sized(cls, start: int, size: int) -> "Slots":
        """A carved slice's slots from its start and size (size 0: a whole GPU that is not split)."""
        return cls(start, start + size) if size else cls.whole()

    @property
    def size(self) -> int:
        return self.end - self.start

    def overlaps(self, other: "Slots") -> bool:
        return self.start < other.end and other.start < self.end
