"""The market's learnt demand mix (claims/demand.py): recent orders' requests weigh the engine's packing."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace.claims import demand
from marketplace.models import Lease, Mode, Order
from tests.factories import UserFactory, client_for
from tests.marketplace.marketsim import top_up

pytestmark = pytest.mark.django_db


def _orders(buyer, n: int, *, gpu_count: int = 1, mode: str = Mode.ON_DEMAND, **kw) -> None:
    """n refused orders (a k-GPU order asks whole GPUs, as the API makes it)."""
    for _ in range(n):
        Order.objects.create(buyer=buyer, mode=mode, state=Order.State.FAILED, gpu_count=gpu_count,
                             whole_gpu=gpu_count > 1, **kw)


def test_the_mix_counts_recent_engine_orders_gangs_and_pins_and_leaves_out_resale_old_and_beyond_the_limit(settings):
    buyer = UserFactory()
    _orders(buyer, 3, gpu_count=8)
    _orders(buyer, 2, memory_gb=10, gpu_models=["a100-80gb"])
    mix = demand.demand_mix_build()
    gangs = dict(mix.multi_gpu("a100-80gb"))
    # three 8-GPU requests weigh 24 on the A100's mix, beside two pinned 1g.10gb and the prior of 20
    assert gangs == {8: pytest.approx(24 / (20 + 24 + 2))}
    assert mix.pinned_share("a100-80gb") == pytest.approx(2 / 46) and mix.pinned_share("h100-80gb") == 0
    # resale purchases are not the engine's demand; orders older than DEMAND_MIX_DAYS are forgotten
    _orders(buyer, 5, gpu_count=8, mode=Mode.RESALE)
    old = timezone.now() - timedelta(days=settings.MARKET["DEMAND_MIX_DAYS"] + 1)
    _orders(buyer, 5, gpu_count=4)
    Order.objects.filter(gpu_count=4).update(created_at=old)
    assert dict(demand.demand_mix_build().multi_gpu("a100-80gb")) == gangs
    # only the newest DEMAND_MIX_ORDERS count; 0 leaves the prior alone
    settings.MARKET = {**settings.MARKET, "DEMAND_MIX_ORDERS": 2}
    assert demand.demand_mix_build().multi_gpu("a100-80gb") == ()  # the two newest are the pinned slices
    settings.MARKET = {**settings.MARKET, "DEMAND_MIX_ORDERS": 0}
    assert demand.demand_mix_build().pinned_share("a100-80gb") == 0


def test_the_mix_is_read_again_only_after_its_ttl(settings):
    settings.MARKET = {**settings.MARKET, "DEMAND_MIX_TTL_SECONDS": 3600}
    demand.forget()
    try:
        first = demand.learnt_mix()
        _orders(UserFactory(), 1, gpu_count=8)
        assert demand.learnt_mix() is first and first.multi_gpu("a100-80gb") == ()
        demand.forget()
        assert dict(demand.learnt_mix().multi_gpu("a100-80gb"))
    finally:
        demand.forget()


@pytest.mark.parametrize("gang_history", [False, True])
def test_where_buyers_wait_for_8_gpu_gangs_a_single_gpu_order_leaves_the_8_gpu_node_whole(fleet, gang_history):
    big = fleet.node("a100-80gb:8", price="2.00")
    small = fleet.node("a100-80gb:1", price="2.04")
    buyer = UserFactory()
    top_up(buyer, "50")
    if gang_history:
        _orders(UserFactory(), 20, gpu_count=8)  # refused: they did not get their GPUs (the full keep charge)
    r = client_for(buyer).post("/api/v1/orders/", {"mode": "on_demand", "whole_gpu": True,
                                                   "duration_seconds": 3600}, format="json")
    assert r.status_code == 201, r.content
    lease = Lease.objects.get(order_id=r.json()["id"])
    # without gangs in the demand the cheaper GPU wins; with them, the single leaves the 8-GPU node whole
    assert lease.slice.gpu.node_id == (small.pk if gang_history else big.pk)


def test_gangs_that_got_their_gpus_at_once_ease_the_keep_charge_and_one_that_waited_brings_it_back():
    buyer, now = UserFactory(), timezone.now()
    for _ in range(40):  # placed at their first attempt, half an hour ago
        Order.objects.create(buyer=buyer, mode=Mode.ON_DEMAND, state=Order.State.PLACED, gpu_count=8,
                             whole_gpu=True, attempts=1, placed_at=now - timedelta(minutes=30))
    Order.objects.update(created_at=now - timedelta(minutes=30))
    eased = demand.demand_mix_build(now=now).keep_factor
    assert eased < 0.2
    waited = Order.objects.create(buyer=buyer, mode=Mode.ON_DEMAND, state=Order.State.QUEUED, gpu_count=8,
                                  whole_gpu=True, attempts=3)
    Order.objects.filter(pk=waited.pk).update(created_at=now - timedelta(minutes=60))
    assert demand.gang_wait(Order.objects.get(pk=waited.pk), now=now) == pytest.approx(3600)
    # the order that still waits is the oldest: the 40 after it ease the charge again
    assert demand.demand_mix_build(now=now).keep_factor == pytest.approx(eased, abs=0.1)
    Order.objects.filter(pk=waited.pk).update(created_at=now - timedelta(minutes=20))  # now the newest
    assert demand.demand_mix_build(now=now).keep_factor > 0.5
    placed_late = Order(created_at=now - timedelta(minutes=5), placed_at=now, attempts=4)
    assert demand.gang_wait(placed_late, now=now) == pytest.approx(300)
    assert demand.gang_wait(Order(created_at=now - timedelta(minutes=5), placed_at=now, attempts=1), now=now) == 0


def test_a_gang_refused_only_for_its_price_tells_the_keep_charge_nothing_one_refused_for_room_does():
    buyer, now = UserFactory(), timezone.now()
    for _ in range(40):  # gangs that got their nodes at once: the charge eases
        Order.objects.create(buyer=buyer, mode=Mode.ON_DEMAND, state=Order.State.PLACED, gpu_count=8,
                             whole_gpu=True, attempts=1, placed_at=now - timedelta(minutes=30))
    Order.objects.update(created_at=now - timedelta(minutes=30))
    eased = demand.demand_mix_build(now=now).keep_factor
    dear = Order.objects.create(buyer=buyer, mode=Mode.ON_DEMAND, state=Order.State.FAILED, gpu_count=8,
                                whole_gpu=True, attempts=1, reasons={"price over cap 2/h": 16, "wrong model": 4})
    Order.objects.filter(pk=dear.pk).update(created_at=now - timedelta(minutes=1))
    assert demand.gang_wait(Order.objects.get(pk=dear.pk), now=now) is None
    assert demand.demand_mix_build(now=now).keep_factor == eased  # neither raised nor eased further
    # refused because no node had 8 free GPUs: that is the wait the keep charge is for
    Order.objects.filter(pk=dear.pk).update(reasons={"price over cap 2/h": 8, "fewer than 8 free GPUs on node": 8})
    assert demand.gang_wait(Order.objects.get(pk=dear.pk), now=now) == pytest.approx(60)
    assert demand.demand_mix_build(now=now).keep_factor > 0.5
