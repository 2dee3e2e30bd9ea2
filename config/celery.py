"""The Celery application: worker and beat share the Django settings (CELERY_* names)."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")

app = Celery("gpumarket")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _route_events_through_outbox(**kwargs):
    # An in-memory channel layer exists once per process: the worker's and beat's are not the web's.
    from django.conf import settings

    if settings.CHANNEL_LAYERS["default"]["BACKEND"].endswith("InMemoryChannelLayer"):
        from scheduler.services import events

        events.USE_OUTBOX = True


from celery.signals import beat_init, worker_process_init, worker_init  # noqa: E402

worker_init.connect(_route_events_through_outbox, weak=False)
worker_process_init.connect(_route_events_through_outbox, weak=False)
beat_init.connect(_route_events_through_outbox, weak=False)
