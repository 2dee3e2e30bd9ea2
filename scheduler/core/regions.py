"""Round-trip times between regions, as data (ms). Rough public inter-region RTTs; good enough to rank.

The latency scorer reads `rtt_ms`; unknown pairs get `UNKNOWN_RTT_MS`, the same region `SAME_REGION_MS`.
"""
from __future__ import annotations

SAME_REGION_MS = 2.0
UNKNOWN_RTT_MS = 200.0

_RTT: dict[frozenset[str], float] = {
    frozenset(pair): ms for pair, ms in (
        (("us-east", "us-west"), 65), (("us-east", "eu-west"), 75), (("us-east", "eu-central"), 90),
        (("us-east", "ap-northeast"), 160), (("us-east", "ap-southeast"), 220), (("us-east", "sa-east"), 115),
        (("us-west", "eu-west"), 140), (("us-west", "eu-central"), 150), (("us-west", "ap-northeast"), 105),
        (("us-west", "ap-southeast"), 170), (("us-west", "sa-east"), 175),
        (("eu-west", "eu-central"), 20), (("eu-west", "ap-northeast"), 215), (("eu-west", "ap-southeast"), 160),
        (("eu-west", "sa-east"), 185), (("eu-central", "ap-northeast"), 225),
        (("eu-central", "ap-southeast"), 155), (("eu-central", "sa-east"), 200),
        (("ap-northeast", "ap-southeast"), 70), (("ap-northeast", "sa-east"), 255),
        (("ap-southeast", "sa-east"), 320),
    )
}
REGIONS: tuple[str, ...] = tuple(sorted({r for pair in _RTT for r in pair}))


def rtt_ms(a: str | None, b: str | None) -> float:
    """Round-trip time between two regions; 0 when the buyer's region is not known (no preference)."""
    if a is None or b is None:
        return 0.0
    if a == b:
        return SAME_REGION_MS
    return _RTT.get(frozenset((a, b)), UNKNOWN_RTT_MS)
