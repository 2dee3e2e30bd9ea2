"""A Celery app on the project's embedded-default broker settings (config.settings.dev with nothing set) whose one
task records each run in a SQLite table: the embedded broker's soak test counts what ran, and how often."""
import os
import sqlite3
from pathlib import Path

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
COUNTS = Path(os.environ["GPUMARKET_VAR_DIR"]) / "runs.sqlite3"

app = Celery("broker-soak")
app.config_from_object("django.conf:settings", namespace="CELERY")


@app.task(name="soak.record")
def record(n: int, sleep: float = 0.0) -> None:
    if sleep:
        import time

        time.sleep(sleep)
    db = sqlite3.connect(COUNTS, timeout=60)
    db.execute("PRAGMA synchronous=NORMAL")  # WAL: a commit survives the process being killed, without an fsync each
    try:
        with db:
            db.execute("INSERT INTO runs (n, pid) VALUES (?, ?)", (n, os.getpid()))
    finally:
        db.close()
