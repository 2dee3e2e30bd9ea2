"""The market's side of the fleet port (scheduler/ports.py): fleet facts move leases, a slice a buyer's open lease
holds is not the provider's to destroy by hand, nor a node with such leases or reservations its to delete, and only
providers (and operators) register nodes. Registered in MarketplaceConfig.ready()."""
from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from marketplace.models import Lease, ProviderProfile, Reservation

from . import leases, reliability


class FleetFacts:
    def slice_ready(self, *, sl, at: datetime) -> None:
        leases.slice_ready(sl=sl, at=at)

    def slice_failed(self, *, sl, at: datetime, reason: str) -> None:
        leases.slice_failed(sl=sl, at=at, reason=reason)

    def slice_destroyed(self, *, sl, at: datetime) -> None:
        leases.slice_destroyed(sl=sl, at=at)

    def node_offline(self, *, node_id, at: datetime) -> None:
        leases.node_offline(node_id=node_id, at=at)

    def workload_state(self, *, node_id, frame: dict) -> None:
        leases.workload_state(node_id=node_id, frame=frame)

    def workload_output(self, *, node_id, frame: dict) -> None:
        leases.workload_output(node_id=node_id, frame=frame)

    def workloads_found(self, *, node_id, found: list[dict]) -> None:
        leases.workloads_found(node_id=node_id, found=found)

    def command_finished(self, *, command) -> None:
        leases.workload_command_finished(command=command)

    def lease_record(self, *, node_ids: list, since: datetime) -> dict:
        return reliability.lease_record(node_ids=node_ids, since=since)

    def slice_holder(self, *, sl) -> str | None:
        lease = Lease.objects.filter(slice=sl, state__in=Lease.OPEN_STATES).only("pk", "state").first()
        if lease is None:
            return None
        return f"this slice runs a buyer's lease ({str(lease.pk)[:8]}, {lease.get_state_display()})"

    def provider_refusal(self, *, user) -> str | None:
        if ProviderProfile.role_of(user):
            return None
        return ("only providers register nodes: become one first on the Provider page (/provider/), where you "
                "accept the provider terms and say where your payouts go")
    def node_holders(self, *, node_id) -> str | None:
        leases = Lease.objects.filter(slice__gpu__node_id=node_id, state__in=Lease.OPEN_STATES).count()
        windows = Reservation.objects.filter(gpu__node_id=node_id, state__in=Reservation.LIVE_STATES,
                                             ends_at__gt=timezone.now()).count()
        said = [f"{n} {what}{'s' if n > 1 else ''}" for n, what in ((leases, "open lease"), (windows, "reservation"))
                if n]
        return " and ".join(said) or None
