"""The Celery application: worker and beat share the Django settings (CELERY_* names)."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")

app = Celery("gpumarket")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def _ensure_embedded_broker_dirs(sender, **kwargs):
    # The filesystem transport does not create its folders.
    from pathlib import Path

    for key in ("data_folder_in", "data_folder_out", "control_folder"):
        folder = (sender.conf.broker_transport_options or {}).get(key)
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
