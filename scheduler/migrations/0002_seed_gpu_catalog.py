"""Seed the GPU catalog from nodeagent.hardware.gpus (every model of DESIGN.md §4 with its MIG geometry).

Updates figures in place and deletes nothing, so GPUs keep their model.
"""
from django.db import migrations


def seed(apps, schema_editor):
    from scheduler.services.catalog import catalog_sync

    catalog_sync(gpu_model_cls=apps.get_model("scheduler", "GpuModel"),
                 gpu_profile_cls=apps.get_model("scheduler", "GpuProfile"))


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
