"""placement.single_option memoises an option's profile, start, packing cost and PUs per GPU state and request
shape (`Pool.option_memo`): whatever the pool and the requests, a memoised answer is the one computing it afresh
gives. A cost that starts to depend on a request field the memo key leaves out fails here (round five of issue 12
§2 needed the gang flag in the key; this is what would have caught it for any field)."""
from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import placement
from scheduler.core.engine import Pool, Scheduler
from scheduler.core.fragmentation import DemandMix
from scheduler.core.model import Request

from .pools import gpu, node

# Each field a request can differ in, with values that matter on the pool below.
FIELDS = {
    "memory_gb": [0, 5, 10, 20, 24, 40, 70, 80],
    "compute_slices": [1, 2, 3, 4, 7],
    "whole_gpu": [False, True],
    "gpu_count": [1, 2, 4],
    "mode": ["on_demand", "spot", "reserved"],
    "short_notice": [False, True],
    "profile": [None, "1g.10gb", "3g.40gb", "7g.80gb"],
    "buyer_region": [None, "us-east", "eu-west"],
    "max_price_per_hour": [None, 50.0],
}
requests = st.builds(Request, **{name: st.sampled_from(values) for name, values in FIELDS.items()})


def _neighbours(request: Request) -> list[Request]:
    """The request and every request that differs from it in one field: the pairs a too-short key would mix up."""
    return [request] + [dataclasses.replace(request, **{name: value}) for name, values in FIELDS.items()
                        for value in values if value != getattr(request, name)]

def _pool() -> Pool:
    return Pool([
        node("a", *[gpu(f"a{i}") for i in range(4)]),
        node("h", *[gpu(f"h{i}", "h100-80gb") for i in range(2)], region="eu-west", price=3.0),
        node("m", gpu("m0", instances=[("3g.40gb", 0)]), gpu("m1", instances=[("1g.10gb", 6)])),
        node("l", gpu("l0", "l4", mig_on=False), gpu("l1", "l4", mig_on=False), price=0.8),
    ], mix=DemandMix(refresh_every=1_000_000))


def _fields(opt):
    return None if opt is None else (opt.profile, opt.start, opt.pack_cost, opt.price_per_hour, opt.pu)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placed=st.lists(requests, max_size=8), probes=st.lists(requests, min_size=1, max_size=3))
def test_a_memoised_option_is_the_option_computed_afresh(placed, probes):
    pool = _pool()
    scheduler = Scheduler(pool)
    for i, request in enumerate(placed):  # layouts of every kind: part-used MIG GPUs, taken whole, untouched
        scheduler.place(dataclasses.replace(request, lease_id=f"L{i}"))
    asked = [r for probe in probes for r in _neighbours(probe)]
    for request in asked + asked:  # the second round answers from the memo the first filled
        for n in pool.nodes.values():
            for g in n.gpus:
                for node_term in (True, False):
                    fresh = placement._single_option(pool, n, g, request, None, 0, node_term)
                    assert _fields(placement.single_option(pool, n, g, request, node_term=node_term)) == \
                        _fields(fresh), (g.uuid, request)
