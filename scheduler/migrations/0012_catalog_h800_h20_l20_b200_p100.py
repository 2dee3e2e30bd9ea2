"""Add H800-80GB, H20-96GB, L20, B200-180GB (MIG geometry from NVIDIA's documentation) and the openb trace's P100.

The same sync as 0002: creates the models nodeagent.hardware.gpus now lists and updates figures in place;
deletes nothing, so GPUs keep their model. On a fresh database 0002 has already seeded them and this is a
no-op that rewrites the same rows.
"""
from django.db import migrations


def seed(apps, schema_editor):
    from scheduler.services.catalog import catalog_sync

    catalog_sync(gpu_model_cls=apps.get_model("scheduler", "GpuModel"),
                 gpu_profile_cls=apps.get_model("scheduler", "GpuProfile"))


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0011_node_drained_by")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
