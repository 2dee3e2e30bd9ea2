"""Deadlocks PostgreSQL breaks off are run again, not dropped, on the paths that lock GPUs, leases and wallets
outside an API request: the beat's queue pass, metering, and the gateway's handling of an agent's result.

The queue pass and the gateway are put into a real lock cycle with another transaction (PostgreSQL detects it and
aborts the one that waited first: theirs); metering gets a real deadlock_detected error from the server in its
first attempt."""
from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections, transaction

from marketplace import metering
from marketplace.lifecycle import leases
from marketplace.models import Lease, Order, Project
from marketplace.products import orders, projects
from marketplace.products.orders import OrderSpec
from nodeagent import protocol
from scheduler.models import AgentCommand, Gpu, Slice
from scheduler.services import slices as slice_services
from tests.agentframes import sim_backend
from tests.factories import UserFactory, node_with_token
from tests.marketplace.marketsim import top_up
from tests.scheduler.test_gateway import barrier, connect_agent

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def wait_for_a_waiter(timeout: float = 20) -> None:
    """Until another backend waits for a lock this connection's transaction holds."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cur:
        while time.monotonic() < deadline:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))")
            if cur.fetchone()[0]:
                return
            time.sleep(0.02)
    raise AssertionError("no other transaction came to wait for this one's lock")


class LockCycle(threading.Thread):
    """Another transaction that locks `first`, waits until someone waits for it, then locks `second` (which that
    someone holds): a cycle. PostgreSQL aborts whichever waited first — the code under test — and this one then
    commits at once."""

    def __init__(self, first, second) -> None:
        super().__init__(daemon=True)
        self.first, self.second = first, second
        self.holding, self.errors = threading.Event(), []

    def run(self) -> None:
        try:
            with transaction.atomic():
                self.first()
                self.holding.set()
                wait_for_a_waiter()
                self.second()
        except Exception as exc:  # noqa: BLE001 - the test reads it
            self.errors.append(exc)
        finally:
            self.holding.set()
            connections.close_all()


def test_a_queued_order_whose_placement_deadlocks_is_placed_in_the_same_pass(fleet):
    fleet.node("l4:1", price="2.00")
    first_buyer, buyer = UserFactory(), UserFactory()
    top_up(first_buyer, "50"), top_up(buyer, "50")
    taken = orders.order_place(buyer=first_buyer, spec=OrderSpec(mode="on_demand", gpu_models=["l4"]))
    fleet.play()
    project = projects.project_create(user=buyer, name="vision", monthly_budget="40.00", budget_cap="hard")
    queued = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", gpu_models=["l4"], if_unavailable="queue",
                                                            project_id=project.pk))
    assert queued.state == Order.State.QUEUED
    leases.lease_end(lease_id=Lease.objects.get(order=taken).pk, buyer=first_buyer)
    fleet.play()
    gpu = Gpu.objects.get()
    # The pass locks the order, the hard-capped project, then the GPU; the other transaction holds the GPU and then
    # asks for the project.
    other = LockCycle(lambda: Gpu.objects.select_for_update().get(pk=gpu.pk),
                      lambda: Project.objects.select_for_update().get(pk=project.pk))
    other.start()
    assert other.holding.wait(timeout=20)
    assert orders.orders_retry() == 1
    other.join(timeout=30)
    assert other.errors == []  # it committed: the pass was the one aborted, and ran again
    queued.refresh_from_db()
    assert queued.state == Order.State.PLACED and Lease.objects.filter(order=queued).count() == 1


def test_a_meter_tick_the_database_aborts_for_a_deadlock_still_posts_what_is_due(fleet, monkeypatch):
    fleet.node("l4:1", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "50")
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", gpu_models=["l4"]))
    fleet.play()
    lease = Lease.objects.get(order=order)
    post, attempts = metering.post, []

    def deadlocked_once(batch, **kw):
        attempts.append(len(batch))
        if len(attempts) == 1:  # the server's own error, as PostgreSQL raises it for a lock cycle
            with connection.cursor() as cur:
                cur.execute("DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$")
        return post(batch, **kw)

    monkeypatch.setattr(metering, "post", deadlocked_once)
    leases.meter_tick(now=lease.billed_until + timedelta(seconds=180))
    lease.refresh_from_db()
    assert attempts == [1, 1] and lease.cost_charged > 0


async def test_an_agents_result_whose_transaction_deadlocks_is_applied_and_its_socket_stays_open():
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend(hostname="d")
    comm = await connect_agent(token, backend)
    gpu = await sync_to_async(lambda: Gpu.objects.get(node=node, index=0))()
    sl = await sync_to_async(slice_services.slice_create)(gpu_id=gpu.pk, profile="4g.40gb", start=0)
    cmd = json.loads(await comm.receive_from(timeout=5))
    result = backend.create_instance(**cmd["args"])
    # Applying the result locks the command, then its slice; the other transaction holds the slice, then asks for
    # the command.
    other = LockCycle(lambda: Slice.objects.select_for_update().get(pk=sl.pk),
                      lambda: AgentCommand.objects.select_for_update().get(pk=cmd["id"]))
    other.start()
    assert await sync_to_async(other.holding.wait, thread_sensitive=False)(20)
    await comm.send_to(text_data=protocol.encode(protocol.result_ok(id=cmd["id"], result=result)))
    await barrier(comm)  # answered: the socket was not closed by the deadlock
    await sync_to_async(other.join, thread_sensitive=False)(30)
    assert other.errors == []

    @sync_to_async
    def check():
        sl.refresh_from_db()
        assert sl.state == Slice.State.READY and sl.instance_uuid == result["instance_uuid"]
        assert AgentCommand.objects.get(pk=cmd["id"]).state == AgentCommand.State.SUCCEEDED
    await check()
    await comm.disconnect()
