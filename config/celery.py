"""The Celery application: worker and beat share the Django settings (CELERY_* names)."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")

app = Celery("gpumarket")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def run_task(name: str, *args, countdown: float | None = None, **kwargs) -> None:
    """Queue the task registered as `name` (run at once where tasks are eager, as in tests): services queue tasks by
    name, since the tasks modules import the services."""
    from celery import current_app

    if name not in current_app.tasks:
        current_app.loader.import_default_modules()  # the apps' tasks modules register their tasks
    current_app.tasks[name].apply_async(args, kwargs, countdown=countdown)


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
