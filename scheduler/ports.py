"""The one port through which the fleet tells the market what happened to capacity, and asks it two things.

The fleet (this app) must not import the market, yet the market has to follow its slices: a lease runs when
its slice is ready, fails when carving failed, ends when the instance is gone or the node goes offline. The
market registers one object implementing `MarketPort` at start-up (marketplace/apps.py); the fleet's
services call it inside the transaction that made the change, so the lease moves in the same commit as the
slice, and whatever the market announces goes out on commit. Without a market (the fleet alone, in a test)
nothing is told and nothing holds a slice.
"""
from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from scheduler.models import Slice


class MarketPort(Protocol):
    def slice_ready(self, *, sl: "Slice", at: datetime) -> None:
        """The agent made the instance (sl.instance_uuid is its device)."""

    def slice_failed(self, *, sl: "Slice", at: datetime, reason: str) -> None:
        """Carving failed or timed out; the slice's memory slices are free again."""

    def slice_destroyed(self, *, sl: "Slice", at: datetime) -> None:
        """The instance is gone and its memory slices are free."""

    def node_offline(self, *, node_id, at: datetime) -> None:
        """The node has been silent since `at` (its last heartbeat) past its timeout and the grace: its leases
        were lost then."""

    def slice_holder(self, *, sl: "Slice") -> str | None:
        """Asked before a provider destroys a slice by hand: a sentence naming who holds it, or None."""

    def provider_refusal(self, *, user) -> str | None:
        """Asked before a node is registered for `user`: a sentence saying why it may not (it has not become a
        provider, and how to), or None. Roles are the market's (accounts): the fleet only asks."""
    def node_holders(self, *, node_id) -> str | None:
        """Asked before a provider deletes a node: what buyers hold there (open leases, reservations whose window
        has not ended), in words, or None."""

    def workload_state(self, *, node_id, frame: dict) -> None:
        """The agent reports a container's state (protocol `workload` frame)."""

    def workload_output(self, *, node_id, frame: dict) -> None:
        """The agent sends a chunk of a container's output (protocol `logs` frame)."""

    def workloads_found(self, *, node_id, found: list[dict]) -> None:
        """The agent said hello with the containers of leases it found running or exited."""

    def command_finished(self, *, command) -> None:
        """A command that is not about a slice (a workload's start or stop) was answered or timed out."""

    def lease_record(self, *, node_ids: list, since: datetime) -> dict:
        """For the reliability score: {(node id str, gpu pk): (leases hosted, leases the node took down, leases its
        buyers reported as failed)} for leases created since `since` on those nodes."""


class _NoMarket:
    def slice_ready(self, *, sl, at): return None
    def slice_failed(self, *, sl, at, reason): return None
    def slice_destroyed(self, *, sl, at): return None
    def node_offline(self, *, node_id, at): return None
    def slice_holder(self, *, sl): return None
    def provider_refusal(self, *, user): return None
    def node_holders(self, *, node_id): return None
    def workload_state(self, *, node_id, frame): return None
    def workload_output(self, *, node_id, frame): return None
    def workloads_found(self, *, node_id, found): return None
    def command_finished(self, *, command): return None
    def lease_record(self, *, node_ids, since): return {}


_market: MarketPort = _NoMarket()


def register_market(port: MarketPort) -> None:
    """Called once by the market at start-up."""
    global _market
    _market = port


def market() -> MarketPort:
    return _market
