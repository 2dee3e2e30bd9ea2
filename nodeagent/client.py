"""The agent's websocket client: handshake, one metrics frame per interval, commands, reconnects.

One asyncio process. Backend calls may block (NVML talks to the driver), so they run in threads. The
connection is retried forever with jittered exponential backoff (given several server URLs, each retry goes to
the next: a web process that is gone leaves its agents to the others), except when the server says the token is
not accepted (close code 4401/4403, or HTTP 401/403 on the handshake) or that a newer connection of the
same node replaced this one (4409: the same token runs on two machines): retrying cannot fix either, so the
agent stops with a clear message and a non-zero exit.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from . import __version__, protocol
from .backends.base import Backend
from .backoff import Backoff
from .commands import CommandLog
from .protocol import CLOSE_FORBIDDEN, CLOSE_REPLACED, CLOSE_UNAUTHORISED
from .runtime.base import NoRuntime, Runtime

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_REJECTED = 3  # the server refused this agent's token
EXIT_REPLACED = 4  # another agent connected with this node's token and took over


class AgentRejected(Exception):
    """The server will not accept this agent (bad token, or a node it may not speak for)."""


class AgentReplaced(AgentRejected):
    """A newer connection with this node's token took over. Reconnecting would only kick that one off in
    turn, and two agents taking turns would each see half the node's commands."""


def _close_code(exc: ConnectionClosed) -> int | None:
    return exc.rcvd.code if exc.rcvd is not None else None


OUTBOX_MAX = 4000  # frames kept while disconnected; log chunks go first when it is full


class Agent:
    def __init__(self, backend: Backend, *, server: str | Sequence[str], token: str, interval: float = 1.0,
                 backoff: Backoff | None = None, welcome_timeout: float = 15.0, runtime: Runtime | None = None):
        """`server`: the gateway's URL, or several (web processes, or sites) tried in turn."""
        self.backend = backend
        self.servers = (server,) if isinstance(server, str) else tuple(server)
        if not self.servers:
            raise ValueError("an agent needs at least one server URL")
        self._server_index = 0
        self.token = token
        self.interval = interval
        self.backoff = backoff or Backoff()
        self.welcome_timeout = welcome_timeout
        self.runtime = runtime or NoRuntime()
        self.commands = CommandLog(backend, runtime=self.runtime)
        self.node_id: str | None = None
        self.sessions = 0  # successful handshakes (tests watch reconnects with it)
        self.metrics_sent = 0
        self._stop = asyncio.Event()
        # What the runtime reports (container states, log chunks), from its threads, until it can be sent.
        self._outbox: deque[dict] = deque()
        self._outbox_ready = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _report(self, frame: dict) -> None:
        """Thread-safe: the runtime's threads hand frames to the event loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._enqueue, frame)

    def _enqueue(self, frame: dict) -> None:
        if len(self._outbox) >= OUTBOX_MAX:
            # Full while disconnected: drop the oldest log chunk (a container's states are never dropped).
            for i, queued in enumerate(self._outbox):
                if queued["type"] == "logs":
                    del self._outbox[i]
                    break
            else:
                self._outbox.popleft()
        self._outbox.append(frame)
        self._outbox_ready.set()

    @property
    def server(self) -> str:
        """The URL this agent is connected to, or will try next."""
        return self.servers[self._server_index]

    def _fail_over(self) -> None:
        if len(self.servers) > 1:
            self._server_index = (self._server_index + 1) % len(self.servers)
            log.info("trying %s next", self.server)

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        """Connect and serve until stopped (exit 0) or rejected by the server (EXIT_REJECTED)."""
        self._loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            try:
                await self._until_stopped(self._connect_once())
            except AgentReplaced as exc:
                log.error("another agent connected with this node's token and replaced this one (%s); "
                          "stopping. Is the same token used on two machines? Give each server its own node "
                          "and token", exc)
                return EXIT_REPLACED
            except AgentRejected as exc:
                log.error("server rejected this agent: %s; check --token / NODEAGENT_TOKEN", exc)
                return EXIT_REJECTED
            except InvalidStatus as exc:
                status = exc.response.status_code
                if status in (401, 403):
                    log.error("server rejected this agent (HTTP %d on the websocket handshake); "
                              "check --token / NODEAGENT_TOKEN", status)
                    return EXIT_REJECTED
                log.warning("cannot connect to %s: HTTP %d", self.server, status)
            except ConnectionClosed as exc:
                log.warning("disconnected from %s (close code %s)", self.server, _close_code(exc))
            except (OSError, InvalidHandshake, TimeoutError, protocol.ProtocolError) as exc:
                log.warning("cannot reach %s: %s", self.server, exc or type(exc).__name__)
            except Exception:  # e.g. the backend failed to take inventory: keep the agent alive, retry
                log.exception("session with %s failed", self.server)
            if self._stop.is_set():
                break
            self._fail_over()
            delay = self.backoff.next_delay()
            log.info("reconnecting in %.1fs", delay)
            await self._until_stopped(asyncio.sleep(delay))
        return EXIT_OK

    async def _until_stopped(self, coro: Any) -> None:
        """Run `coro` until it ends or stop() is called, whichever is first."""
        task = asyncio.ensure_future(coro)
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.done() and not task.cancelled():
            task.result()  # re-raise what ended the session

    async def _connect_once(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with connect(self.server, additional_headers=headers, max_size=protocol.MAX_FRAME_BYTES,
                           open_timeout=10, user_agent_header=f"gpumarket-nodeagent/{__version__}") as ws:
            try:
                await self._session(ws)
            except ConnectionClosed as exc:
                self._check_rejected(_close_code(exc), exc.rcvd.reason if exc.rcvd else "")
                raise
            # The server closed cleanly (the receive loop ended): still a disconnect to recover from.
            self._check_rejected(ws.close_code, ws.close_reason or "")
            log.warning("disconnected from %s (close code %s)", self.server, ws.close_code)

    @staticmethod
    def _check_rejected(code: int | None, reason: str) -> None:
        if code == CLOSE_REPLACED:
            raise AgentReplaced(f"close code {code}" + (f": {reason}" if reason else ""))
        if code in (CLOSE_UNAUTHORISED, CLOSE_FORBIDDEN):
            raise AgentRejected(f"close code {code}" + (f": {reason}" if reason else ""))

    async def _session(self, ws: ClientConnection) -> None:
        facts = await asyncio.to_thread(self.backend.inventory)
        self.runtime.bind(self._report, node=facts["hostname"])  # its containers are labelled with the host
        # The containers of leases found here: the server adopts those of open leases and removes the others.
        workloads = await asyncio.to_thread(self.runtime.found)
        await ws.send(protocol.encode(protocol.hello(agent_version=__version__, runtime=self.runtime.name,
                                                     workloads=workloads, **facts)))
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result and drops a cancel (stop())
        # that lands in the same step as the welcome, and the session then runs on past the stop.
        async with asyncio.timeout(self.welcome_timeout):
            welcome = await self._welcome(ws)
        interval = welcome.get("metrics_interval")
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) or not (
                math.isfinite(interval) and 0.05 <= interval <= 3600):
            interval = self.interval
        self.node_id = welcome.get("node_id")
        self.sessions += 1
        self.backoff.reset()
        log.info("connected to %s as node %s; %d GPUs; metrics every %gs", self.server, self.node_id,
                 len(facts["gpus"]), interval)
        metrics = asyncio.create_task(self._metrics_loop(ws, float(interval)))
        receiver = asyncio.create_task(self._receive_loop(ws))
        sender = asyncio.create_task(self._outbox_loop(ws))
        try:
            done, _ = await asyncio.wait({metrics, receiver, sender}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (metrics, receiver, sender):
                task.cancel()
            await asyncio.gather(metrics, receiver, sender, return_exceptions=True)
        for task in done:
            task.result()

    async def _welcome(self, ws: ClientConnection) -> dict:
        async for text in ws:
            frame = self._decode(text)
            if frame is None:
                continue
            if frame["type"] == "welcome":
                return frame
            if frame["type"] == "error":
                log.error("server error before welcome: %s %s", frame.get("code"), frame.get("message"))
                if frame.get("code") in (protocol.E_UNAUTHORISED, protocol.E_FORBIDDEN):
                    raise AgentRejected(f"{frame.get('code')}: {frame.get('message')}")
            else:
                log.warning("ignoring %s frame before welcome", frame["type"])
        self._check_rejected(ws.close_code, ws.close_reason or "")
        raise ConnectionError(f"the server closed the connection before welcome (code {ws.close_code})")

    @staticmethod
    def _decode(text: str | bytes) -> dict | None:
        try:
            return protocol.decode(text)
        except protocol.ProtocolError as exc:
            log.warning("ignoring a bad frame from the server: %s", exc.message)
            return None

    async def _metrics_loop(self, ws: ClientConnection, interval: float) -> None:
        """One frame per interval on a monotonic schedule: a slow sample delays one frame, not all later
        ones, and missed ticks are skipped rather than sent in a burst."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                gpus = await asyncio.to_thread(self.backend.sample)
            except Exception:
                log.exception("sampling metrics failed; skipping this interval")
            else:
                await ws.send(protocol.encode(protocol.metrics(ts=time.time(), gpus=gpus)))
                self.metrics_sent += 1
            next_at += interval
            now = loop.time()
            if next_at <= now:
                next_at += math.ceil((now - next_at) / interval) * interval
            await asyncio.sleep(next_at - now)

    async def _outbox_loop(self, ws: ClientConnection) -> None:
        """Send what the runtime reported, in order; a frame the connection could not take is kept for the next."""
        while True:
            await self._outbox_ready.wait()
            while self._outbox:
                frame = self._outbox[0]
                await ws.send(protocol.encode(frame))
                self._outbox.popleft()
            self._outbox_ready.clear()

    async def _receive_loop(self, ws: ClientConnection) -> None:
        replies: set[asyncio.Task] = set()
        try:
            async for text in ws:
                frame = self._decode(text)
                if frame is None:
                    continue
                kind = frame["type"]
                if kind == "command":
                    # Each command answers in its own task: a slow create must not hold up a ping.
                    task = asyncio.create_task(self._answer(ws, frame))
                    replies.add(task)
                    task.add_done_callback(replies.discard)
                elif kind == "error":
                    log.warning("server error: %s %s (ref %s)", frame.get("code"), frame.get("message"),
                                frame.get("ref"))
                elif kind != "welcome":
                    log.warning("ignoring unexpected %s frame", kind)
        finally:
            for task in replies:
                task.cancel()

    async def _answer(self, ws: ClientConnection, frame: dict) -> None:
        command_id = frame.get("id")
        try:
            protocol.validate_command(frame)
        except protocol.ProtocolError as exc:
            if not isinstance(command_id, str):
                log.warning("dropping a command without an id: %s", exc.message)
                return
            log.info("command %s refused: %s", command_id, exc.message)
            reply = protocol.result_error(id=command_id, code=exc.code, message=exc.message)
        else:
            reply = await self.commands.answer(command_id, frame["op"], frame["args"])
        try:
            await ws.send(protocol.encode(reply))
        except ConnectionClosed:
            # The result is kept; the server asks again with the same id after reconnecting.
            log.info("connection closed before the result of %s could be sent", command_id)
