"""Add H800-80GB, H20-96GB, L20, B200-180GB (MIG geometry from NVIDIA's documentation) and the openb trace's P100.

The same sync as 0002 (its function, run again): creates the models nodeagent.hardware.gpus now lists and
updates figures in place; deletes nothing, so GPUs keep their model. On a fresh database 0002 has already
seeded them and this rewrites the same rows.
"""
from importlib import import_module

from django.db import migrations

seed = import_module("scheduler.migrations.0002_seed_gpu_catalog").seed


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0011_node_drained_by")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
