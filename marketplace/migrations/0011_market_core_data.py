"""What is stored under the old rules, moved to the market core's (issue: one price function, one slots value,
per-line projects, per-minute metering):

- a reserved window on a GPU that is not split held slots [0, 1); it holds every slot now, [0, 64)
  (scheduler.core.slots.Slots.whole), so it overlaps anything ever put on that GPU;
- spot prices were a factor on the on-demand price (1.8 × base); the factor is on base now, with the same
  band (0.5..0.7) from the same free share. The history is restated under the new rule: each point's price
  becomes base × factor (its old price / 1.8), so the chart does not drop when the rule changed;
- an open resale listing asking more than the new cap (0.9 × base × share, was 0.9 × on demand) is lowered to
  the cap, its price for the window recomputed;
- ledger entries take their transaction's project, except a provider's earnings and the platform's lines,
  which never carry a buyer's project;
- a running lease has accrued up to where it was billed.
"""
from decimal import ROUND_HALF_UP, Decimal

from django.db import migrations
from django.db.models import F

MICRO = Decimal("0.000001")
OLD_ON_DEMAND = Decimal("1.8")
RESALE_CAP = Decimal("0.9")


def _share(geometry: dict | None, profile: str) -> Decimal:
    if not geometry or not profile or profile == "whole":
        return Decimal("1")
    for p in geometry["profiles"]:
        if p["name"] == profile:
            share = max(p["compute_slices"] / geometry["compute_slices"], p["memory_slices"] / geometry["memory_slices"])
            return Decimal(repr(share))
    return Decimal("1")


def forward(apps, schema_editor):
    Reservation = apps.get_model("marketplace", "Reservation")
    SpotPrice = apps.get_model("marketplace", "SpotPrice")
    ResaleListing = apps.get_model("marketplace", "ResaleListing")
    LedgerEntry = apps.get_model("marketplace", "LedgerEntry")
    Lease = apps.get_model("marketplace", "Lease")

    Reservation.objects.filter(profile="", slot_start=0, slot_end=1).update(slot_end=64)
    for point in SpotPrice.objects.all().iterator():
        point.price_per_gpu_hour = (point.price_per_gpu_hour / OLD_ON_DEMAND).quantize(MICRO, ROUND_HALF_UP)
        point.save(update_fields=["price_per_gpu_hour"])
    for listing in ResaleListing.objects.filter(state="open").select_related("reservation__gpu__node").iterator():
        gpu = listing.reservation.gpu
        geometry = gpu.mig_geometry if gpu.mig_enabled else None
        cap = (gpu.node.price_per_gpu_hour * _share(geometry, listing.reservation.profile) * RESALE_CAP).quantize(
            MICRO, ROUND_HALF_UP)
        if listing.ask_per_hour > cap:
            seconds = Decimal(str((listing.ends_at - listing.starts_at).total_seconds()))
            listing.ask_per_hour = cap
            listing.price_total = (cap * seconds / 3600).quantize(MICRO, ROUND_HALF_UP)
            listing.save(update_fields=["ask_per_hour", "price_total"])
    for project_id in (LedgerEntry.objects.filter(transaction__project__isnull=False)
                       .values_list("transaction__project", flat=True).distinct()):
        LedgerEntry.objects.filter(account__kind="wallet", transaction__project=project_id).update(
            project=project_id)
    Lease.objects.filter(accrued_until__isnull=True, billed_until__isnull=False).update(
        accrued_until=F("billed_until"))


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0010_market_core"), ("scheduler", "0004_node_drain_requested")]
    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
