from django.db import migrations, models


def drained_nodes_keep_their_drain(apps, schema_editor):
    apps.get_model("scheduler", "Node").objects.filter(status="draining").update(drain_requested=True)


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0003_outbox")]

    operations = [
        migrations.AddField(
            model_name="node", name="drain_requested",
            field=models.BooleanField(default=False, help_text="drained by its provider or an operator")),
        migrations.RunPython(drained_nodes_keep_their_drain, migrations.RunPython.noop),
    ]
