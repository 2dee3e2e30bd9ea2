"""On PostgreSQL: no two live reservations on overlapping memory slices of one GPU in overlapping windows.

An exclusion constraint over (gpu = , int4range(slots) &&, tstzrange(window) &&) for booked and running
reservations; btree_gist supplies the GiST equality on the GPU id. SQLite has no exclusion constraints, so
this migration does nothing there and the reservation service's check under the GPU row lock is the guard
(it is the guard on PostgreSQL too; the constraint is the database's last word).
"""
from django.db import migrations

CONSTRAINT = "reservation_no_overlapping_slots"

FORWARD = [
    "CREATE EXTENSION IF NOT EXISTS btree_gist",
    f"""ALTER TABLE marketplace_reservation ADD CONSTRAINT {CONSTRAINT} EXCLUDE USING gist (
        gpu_id WITH =,
        int4range(slot_start, slot_end, '[)') WITH &&,
        tstzrange(starts_at, ends_at, '[)') WITH &&
    ) WHERE (state IN ('booked', 'active'))""",
]


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for sql in FORWARD:
        schema_editor.execute(sql)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"ALTER TABLE marketplace_reservation DROP CONSTRAINT IF EXISTS {CONSTRAINT}")


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0003_market")]
    operations = [migrations.RunPython(forward, backward, elidable=False)]
