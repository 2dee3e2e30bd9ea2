"""The embedded Celery broker: messages as files under var/celery, safe for several processes.

kombu's filesystem transport, which this replaces, wrote a message straight into the folder consumers read
from and moved it out before reading it: a consumer could take a file its producer had not finished
writing (an empty read, `JSONDecodeError`, and the worker stopped), and two consumers could both copy one
file across filesystems. Messages were also dropped when a worker died between taking and running them.

Here every step that other processes can see is one `rename(2)` inside one filesystem, which is atomic:

- a producer writes `tmp/<name>` in full, then renames it into `queue/`: a consumer sees whole files only;
- a consumer claims a message by renaming it from `queue/` into its own `claimed/<token>/` folder: only
  one rename of a file can succeed, so exactly one consumer gets each message;
- the claim is deleted when the task is acknowledged (Celery acknowledges after the task ran:
  CELERY_TASK_ACKS_LATE), and put back into `queue/` when it is rejected or the worker stops cleanly;
- each consumer holds an exclusive `flock` on `claimed/<token>.lock` while it lives. The kernel drops the
  lock when the process dies, even by `kill -9`, so any consumer that can take a lock finds a dead one's
  claims and returns them to `queue/` (at start, then every RECOVER_SECONDS): a message is never lost, and
  is run a second time only if its worker died while running it.

Names start with a nanosecond timestamp, so consumers take messages about in the order they were sent.
Fanout (Celery's remote control) and the exchange tables are kombu's own, unchanged.
"""
from __future__ import annotations

import fcntl
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from pathlib import Path

from kombu.transport import filesystem
from kombu.utils.json import dumps, loads

log = logging.getLogger(__name__)

RECOVER_SECONDS = 10.0
# A queue found empty is listed again after this long at the soonest (a consumer polls every ~0.1 s when idle).
RESCAN_SECONDS = 0.05


def broker_folders(root: Path) -> dict:
    """The transport options for an embedded broker kept under `root` (settings and tests share this)."""
    return {"data_folder_in": str(root / "queue"), "data_folder_out": str(root / "queue"),
            "control_folder": str(root / "control"), "store_processed": False,
            # How often an idle consumer looks for new messages (kombu's default is 1 s).
            "polling_interval": 0.1}


def _root(queue_folder: str) -> Path:
    return Path(queue_folder).parent


class Channel(filesystem.Channel):
    _claim_dir: Path | None = None
    _claim_lock = None
    _recovered_at = 0.0
    _scanned_at = float("-inf")  # never listed

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._claims: dict[str, Path] = {}  # delivery tag -> the claimed file
        self._no_ack: set[str] = set()  # queues consumed without acknowledgements (remote control)
        self._pending: dict[str, deque] = {}  # queue -> names listed and not yet tried
        root = _root(self.data_folder_in)
        self._tmp, self._claimed = root / "tmp", root / "claimed"
        for folder in (Path(self.data_folder_in), self.control_folder, self._tmp, self._claimed):
            folder.mkdir(parents=True, exist_ok=True)

    # --- producing ---------------------------------------------------------------------------------
    def _put(self, queue, payload, **kwargs):
        name = f"{time.time_ns():020d}_{uuid.uuid4().hex}.{queue}.msg"
        tmp = self._tmp / name
        try:
            tmp.write_bytes(dumps(payload).encode())
            os.rename(tmp, os.path.join(self.data_folder_out, name))
        except OSError as exc:
            raise filesystem.ChannelError(f"cannot add a message to {self.data_folder_out}: {exc}") from exc

    # --- consuming ---------------------------------------------------------------------------------
    def _get(self, queue):
        self._ensure_claimant()
        if time.monotonic() - self._recovered_at > RECOVER_SECONDS:
            self._recover_dead_claims()
        pending = self._pending.get(queue)
        if not pending:
            if time.monotonic() - self._scanned_at < RESCAN_SECONDS:
                raise filesystem.Empty()
            self._scan()
            pending = self._pending.get(queue)
        while pending:
            name = pending.popleft()
            claim = self._claim_dir / name
            try:
                os.rename(os.path.join(self.data_folder_in, name), claim)
            except FileNotFoundError:
                continue  # another consumer took it
            try:
                payload = loads(claim.read_bytes())
                tag = payload["properties"]["delivery_tag"]
            except (ValueError, KeyError, TypeError) as exc:
                # Cannot happen through _put (whole files only); a file put there by hand: set aside, not fatal.
                bad = _root(self.data_folder_in) / "bad"
                bad.mkdir(exist_ok=True)
                os.rename(claim, bad / name)
                log.error("broker: message %s is not a kombu message (%s); moved to %s", name, exc, bad)
                continue
            if queue in self._no_ack:
                claim.unlink()
            else:
                self._claims[tag] = claim
            return payload
        raise filesystem.Empty()

    def _scan(self) -> None:
        """List the queue folder once for every queue this consumer reads, oldest first. One listing serves them
        all: a worker also polls its remote-control queue, nearly always empty, and listing the whole folder for
        it on every poll made each message cost a read of the backlog (20,000 waiting: ~110 tasks/s)."""
        self._scanned_at = time.monotonic()
        pending: dict[str, deque] = {}
        for name in sorted(os.listdir(self.data_folder_in)):
            queue, dot, kind = name.partition(".")[2].rpartition(".")
            if dot and kind == "msg":
                pending.setdefault(queue, deque()).append(name)
        self._pending = pending

    def basic_consume(self, queue, no_ack, *args, **kwargs):
        if no_ack:
            self._no_ack.add(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_get(self, queue, no_ack=False, **kwargs):
        message = super().basic_get(queue, no_ack=no_ack, **kwargs)
        if message is not None and no_ack:
            self._forget(message.delivery_tag)
        return message

    def basic_ack(self, delivery_tag, multiple=False):
        super().basic_ack(delivery_tag, multiple=multiple)
        self._forget(delivery_tag)
        self.connection.acked.set()  # a worker slot is free: the consumer need not sleep out its poll

    def _restore(self, message):
        """A rejected message, or one unacknowledged when the worker stops: back into its queue."""
        super()._restore(message)
        self._forget(message.delivery_tag)

    def _forget(self, delivery_tag) -> None:
        claim = self._claims.pop(delivery_tag, None)
        if claim is not None:
            try:
                claim.unlink()
            except FileNotFoundError:
                pass

    def close(self):
        super().close()  # restores what was not acknowledged
        if self._claim_lock is not None:
            self._give_back(self._claim_dir)
            (self._claimed / f"{self._claim_dir.name}.lock").unlink(missing_ok=True)
            self._claim_lock.close()
            self._claim_lock = None

    # --- claims of consumers that died ---------------------------------------------------------------
    def _ensure_claimant(self) -> None:
        """Become a consumer: a claim folder and a lock held for this process's life (lazily: producers
        never make one)."""
        if self._claim_lock is not None and self._claim_pid == os.getpid():
            return
        token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        claim_dir = self._claimed / token
        claim_dir.mkdir()
        # Locked before it gets the name a recoverer looks for (recoverers skip the hidden name), so no recoverer
        # can take it for a dead one's.
        hidden = self._claimed / f".{token}.lock"
        lock = open(hidden, "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(hidden, self._claimed / f"{token}.lock")
        except OSError:
            lock.close()
            hidden.unlink(missing_ok=True)
            claim_dir.rmdir()
            raise
        self._claim_dir = claim_dir
        self._claim_lock, self._claim_pid = lock, os.getpid()
        self._recover_dead_claims()

    def _recover_dead_claims(self) -> int:
        """Return the claims of consumers whose lock is free (their process is gone) to their queues."""
        self._recovered_at = time.monotonic()
        returned = 0
        for lock_path in self._claimed.glob("*.lock"):
            if lock_path.name.startswith(".") or (self._claim_dir is not None
                                                  and lock_path.stem == self._claim_dir.name):
                continue  # a consumer taking its lock right now, or our own
            try:
                lock = open(lock_path, "r+")
            except FileNotFoundError:
                continue
            with lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # alive
                returned += self._give_back(self._claimed / lock_path.stem)
                lock_path.unlink(missing_ok=True)
        if returned:
            log.warning("broker: %d message(s) claimed by a worker that died were put back in their queues",
                        returned)
        return returned

    def _give_back(self, folder: Path) -> int:
        returned = 0
        if folder.is_dir():
            for claim in folder.iterdir():
                try:
                    os.rename(claim, os.path.join(self.data_folder_in, claim.name))
                    returned += 1
                except FileNotFoundError:
                    pass
            folder.rmdir()
        return returned


class Transport(filesystem.Transport):
    Channel = Channel
    driver_type = driver_name = "gpumarket-files"

    def __init__(self, client, **kwargs):
        super().__init__(client, **kwargs)
        self.acked = threading.Event()

    def drain_events(self, connection, timeout=None):
        """kombu's loop, but a consumer whose prefetch is full wakes as soon as a task is acknowledged
        (acknowledgements come from the pool's thread) instead of sleeping out the polling interval:
        otherwise a worker runs at most `concurrency` tasks per interval, however short they are."""
        started = time.monotonic()
        while True:
            self.acked.clear()
            try:
                self.cycle.get(self._deliver, timeout=timeout)
                return
            except filesystem.Empty:
                if timeout is not None and time.monotonic() - started >= timeout:
                    raise socket.timeout()
                self.acked.wait(min(self.polling_interval, timeout) if timeout else self.polling_interval)
