"""The metrics writer process: writes the ingest buffer's flushes outside the web process's interpreter.

A flush upserts thousands of rows; done in a thread of the web process it held the GIL for tens of
milliseconds at a time and every websocket frame queued behind it (docs/performance.md). Each web process
starts one writer (`python -m scheduler.gateway.writer`) and hands it one flush at a time over a pipe: the
web process keeps the buffer (capped, merged, retried: scheduler/gateway/ingest.py), the writer holds at
most the flush it is writing, so memory is bounded on both sides.

The pipe carries length-prefixed pickles: first the database settings the web process uses (so a test
database or a renamed one is the writer's too), then one `(latest, rollups, heard)` per flush, each answered
`("ok",)` or `("error", text)`. A writer that died is started again at the next flush and the flush it had
is retried: a writer killed after its commit but before its answer writes that flush twice (the latest
values and heartbeats are idempotent; that flush's rollup samples count twice). A flush unanswered for
FLEET_METRICS_WRITE_TIMEOUT (a database that hangs) ends that writer and counts as failed. Clean shutdown: the web
process writes what it holds, then closes the pipe; the writer exits at end of input, and ignores SIGINT
and SIGTERM (sent to the whole process group by Ctrl-C or a service manager) so it cannot die first.
"""
from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
_HEADER = struct.Struct("!I")


class WriterGone(RuntimeError):
    """The writer process exited (or was killed) before answering; the flush was not confirmed."""


class WriteFailed(RuntimeError):
    """The writer answered that the flush failed (the database refused it or was unreachable)."""


def _send(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


def _recv(stream):
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


class WriterProcess:
    """The web process's handle on its writer: `write()` blocks (call it from a thread), one at a time."""

    def __init__(self, *, database: dict, timeout: float = 60.0) -> None:
        self.database = database
        self.timeout = timeout  # a flush unanswered this long (a database that hangs) is given up: see write()
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.in_flight = False  # a flush is on the pipe, not yet answered
        self._lock = threading.Lock()  # one flush on the pipe at a time (the periodic one, a test's, shutdown's)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def _start(self) -> None:
        if self.proc is not None:
            log.warning("metrics writer process %d exited with %s; starting another", self.proc.pid,
                        self.proc.poll())
            self._reap()
        self.proc = subprocess.Popen([sys.executable, "-m", "scheduler.gateway.writer"], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.starts += 1
        _send(self.proc.stdin, ("init", self.database))

    def _reap(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def write(self, latest: dict, rollups: dict, heard: dict) -> None:
        """Write one flush through the writer process, starting (or restarting) it first if needed."""
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            try:
                self.in_flight = True
                _send(self.proc.stdin, ("write", latest, rollups, heard))
                if not select.select([self.proc.stdout], [], [], self.timeout)[0]:
                    # A database that hangs instead of refusing (a dropped route, a lock held for ever): end
                    # this writer so the flush counts as failed and the web process's buffer cap applies.
                    self.proc.kill()
                    self._reap()
                    raise WriteFailed(f"the metrics writer did not answer within {self.timeout:g} s; restarted")
                reply = _recv(self.proc.stdout)
            except (BrokenPipeError, ConnectionResetError):
                reply = None
            finally:
                self.in_flight = False
            if reply is None:
                self._reap()
                raise WriterGone(f"the metrics writer process exited (code {self.proc.returncode}) during a flush")
            if reply[0] != "ok":
                raise WriteFailed(reply[1])

    def close(self) -> None:
        """End the writer after the flush in progress (its stdin closes: it exits at end of input)."""
        with self._lock:
            if self.proc is not None:
                self._reap()
                self.proc = None


def main() -> None:
    # The pipe is the protocol: keep anything printed (a library's warning) off it.
    wire = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    source = sys.stdin.buffer
    # Ctrl-C and a service manager signal the whole group; the web process decides when this one ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
    first = _recv(source)
    if first is None:
        return
    import django
    from django.conf import settings

    settings.DATABASES["default"] = first[1]  # before any connection exists
    django.setup()
    from django.db import close_old_connections, connection

    from scheduler.services import events

    from .ingest import _write
    if settings.CHANNEL_LAYERS["default"]["BACKEND"].endswith("InMemoryChannelLayer"):
        # Not the web process's layer: announcements (a node back online) go through the outbox it relays.
        events.USE_OUTBOX = True
    while (message := _recv(source)) is not None:
        try:
            _write(*message[1:])
        except Exception as exc:  # the web process keeps the flush and retries it; this process goes on
            log.warning("metrics flush failed: %s", exc)
            connection.close()  # a broken connection is not reused
            _send(wire, ("error", f"{type(exc).__name__}: {exc}"))
        else:
            close_old_connections()
            _send(wire, ("ok",))


if __name__ == "__main__":
    main()
