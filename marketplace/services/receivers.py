"""The market's receivers of the fleet's signals (connected in MarketplaceConfig.ready()). They run inside
the fleet's transaction, so lease changes commit or roll back with the slice change that caused them."""
from django.dispatch import receiver

from scheduler.signals import node_offline, slice_destroyed, slice_failed, slice_hold_check, slice_ready


@receiver(slice_ready, dispatch_uid="market.slice_ready")
def _slice_ready(sender, slice, at, **kw):
    from marketplace.services.leases import on_slice_ready

    on_slice_ready(sl=slice, at=at)


@receiver(slice_failed, dispatch_uid="market.slice_failed")
def _slice_failed(sender, slice, at, reason="", **kw):
    from marketplace.services.leases import on_slice_failed

    on_slice_failed(sl=slice, at=at, reason=reason)


@receiver(slice_destroyed, dispatch_uid="market.slice_destroyed")
def _slice_destroyed(sender, slice, at, **kw):
    from marketplace.services.leases import on_slice_destroyed

    on_slice_destroyed(sl=slice, at=at)


@receiver(node_offline, dispatch_uid="market.node_offline")
def _node_offline(sender, node_id, at, **kw):
    from marketplace.services.leases import leases_node_offline

    leases_node_offline(node_id=node_id, at=at)


@receiver(slice_hold_check, dispatch_uid="market.slice_hold_check")
def _slice_hold_check(sender, slice, **kw):
    """A buyer's open lease holds its slice: its provider may not destroy it by hand (the market ends it)."""
    from marketplace.models import Lease

    lease = Lease.objects.filter(slice=slice, state__in=Lease.OPEN_STATES).only("pk", "state").first()
    if lease is None:
        return None
    return f"this slice runs a buyer's lease ({str(lease.pk)[:8]}, {lease.get_state_display()})"
