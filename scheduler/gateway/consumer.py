"""The agent gateway: one websocket per node agent (protocol v1, nodeagent/protocol.py).

It authenticates the node token, applies the hello (inventory), takes metrics batches (buffered, fanned
out to console subscribers at once, health-checked), forwards commands and applies their results. A
malformed frame gets an error frame and changes nothing; an unauthorised socket is closed (4401); a frame
naming another node's GPU is refused (4403 for a hello, an error frame for metrics). Only one socket speaks
for a node: each socket gets a session number when it authenticates (node_agent_connect), an accepted hello
closes every older socket of the node (4409), and an older socket's hello that arrives after a newer one was
accepted is refused (4409 too). Once a socket is closed it sends nothing more (LoopConsumer.closed).
"""
from __future__ import annotations

import contextlib
import json
import logging
import time

from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from nodeagent import protocol
from scheduler.errors import DomainError
from scheduler.ports import market
from scheduler.services import commands as command_services, health as health_services, nodes as node_services
from scheduler.services.events import REVOKED_SAID, agent_group, node_group
from scheduler.services.transactions import transient_retried

from .base import LoopConsumer, dumps
from .ingest import INGEST
from .limits import DropWindow, TokenBucket
from .relay import RELAY

log = logging.getLogger(__name__)

CLOSE_BAD_FRAME, CLOSE_UNAUTHORISED = protocol.CLOSE_BAD_FRAME, protocol.CLOSE_UNAUTHORISED
CLOSE_FORBIDDEN, CLOSE_REPLACED = protocol.CLOSE_FORBIDDEN, protocol.CLOSE_REPLACED
MAX_BAD_FRAMES = 10  # after this many malformed frames on one socket, the agent is broken: close it
CLOSE_FOR_STATUS = {401: CLOSE_UNAUTHORISED, 403: CLOSE_FORBIDDEN, 409: CLOSE_REPLACED}


def on_db(fn):
    """fn on a worker thread (channels' database_sync_to_async), run again whole while PostgreSQL aborts its
    transaction to undo a deadlock: an agent's result, workload state or hello is applied at once instead of
    failing the handler, which closes the socket (1011) and leaves the frame to the agent's reconnect."""
    return database_sync_to_async(transient_retried(fn))


def _bearer(scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            text = value.decode("latin-1")
            if text.lower().startswith("bearer "):
                return text[7:].strip()
    return ""


class AgentConsumer(LoopConsumer):
    node_id = None
    session = 0  # this socket's place among the node's sockets (node_agent_connect)
    ready = False  # True while this socket speaks for the node: its hello was applied and nothing replaced it
    ended = False  # its end was recorded (node_disconnected)

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        except Exception:
            # A handler or the channel layer failed (Redis away): the server drops the socket without the
            # disconnect handler, and the node's history must still say its socket closed.
            with contextlib.suppress(Exception):  # the database may be what failed; the cause is raised below
                await self._end(code=1011, reason="server error", by="server")
            raise

    async def connect(self):
        found = await on_db(node_services.node_agent_connect)(token=_bearer(self.scope))
        await self.accept()
        if found is None:
            await self._error(protocol.E_UNAUTHORISED, "unknown or missing node token")
            await self.close(code=CLOSE_UNAUTHORISED)
            return
        node, self.session = found
        self.node_id = node.pk
        self.token_hash = node.token_hash
        self.node_key = str(node.pk)
        self.console_group = node_group(node.pk)
        self.node_label = node.name
        self.bad_frames = 0
        self.gpu_ids: dict[str, int] = {}
        self.cordoned: set[str] = set()
        self.last_dbe: dict[str, float] = {}
        self.tdp_w: dict[str, int] = {}  # GPU uuid -> its catalog model's TDP (watts)
        self.power_streak: dict[str, int] = {}  # GPU uuid -> samples in a row over the power limit
        self.thresholds = health_services.Thresholds.from_settings()
        fleet = settings.FLEET
        self.metrics_bucket = TokenBucket(rate=fleet["AGENT_METRICS_RATE"], burst=fleet["AGENT_METRICS_BURST"])
        self.event_bucket = TokenBucket(rate=fleet["AGENT_EVENT_RATE"], burst=fleet["AGENT_EVENT_BURST"])
        self.workload_bucket = TokenBucket(rate=fleet["AGENT_WORKLOAD_RATE"], burst=fleet["AGENT_WORKLOAD_BURST"])
        self.logs_bucket = TokenBucket(rate=fleet["AGENT_LOGS_RATE"], burst=fleet["AGENT_LOGS_BURST"])
        self.hello_bucket = TokenBucket(rate=fleet["AGENT_HELLO_RATE"], burst=fleet["AGENT_HELLO_BURST"])
        self.event_detail_max = fleet["AGENT_EVENT_DETAIL_MAX_BYTES"]
        self.drops = DropWindow(window=fleet["AGENT_DROP_WINDOW_SECONDS"], max_dropped=fleet["AGENT_MAX_DROPPED"])
        INGEST.ensure_running()
        RELAY.ensure_running()

    async def disconnect(self, code):
        if self.node_id is None:
            return
        await self.channel_layer.group_discard(agent_group(self.node_id), self.channel_name)
        if self.close_code is not None:  # this side closed it: its code and reason say why
            await self._end(code=self.close_code, reason=self.close_reason, by="server")
        else:
            await self._end(code=code, reason="", by="agent")

    async def _end(self, *, code, reason: str, by: str) -> None:
        """Record once that the socket speaking for the node closed (nothing for one that never did)."""
        if self.ready and not self.ended:
            self.ended = True
            await on_db(node_services.node_disconnected)(
                node_id=self.node_id, session=self.session, code=code, reason=reason, by=by)

    async def _error(self, code: str, message: str, ref: str | None = None) -> None:
        await self.send(text_data=protocol.encode(protocol.error(code=code, message=message, ref=ref)))

    async def receive(self, text_data=None, bytes_data=None):
        if self.node_id is None or self.closed:
            return  # frames read before the close: nothing of them is applied or answered
        try:
            frame = protocol.validate(protocol.decode(text_data if text_data is not None else bytes_data))
        except protocol.ProtocolError as exc:
            # Another protocol version will not become v1 by retrying frames on this socket.
            await self._refuse(exc.code, exc.message, close=exc.code == protocol.E_VERSION)
            return
        kind = frame["type"]
        if kind == "hello":
            # A hello is the costliest frame (the whole inventory upserted in one transaction under the node's
            # lock): a flood of them slowed every API request, so they are limited like the rest.
            if self.hello_bucket.take():
                await self._hello(frame)
            else:
                await self._drop("hello")
        elif not self.ready:
            await self._refuse(protocol.E_BAD_FRAME, f"{kind} before hello", close=True)
        elif kind == "metrics":
            if self.metrics_bucket.take():
                await self._metrics(frame)
            else:
                await self._drop("metrics")
        elif kind == "result":
            await on_db(command_services.command_complete)(node_id=self.node_id, frame=frame)
        elif kind == "event":
            await self._event(frame)
        elif kind == "workload":
            if self.workload_bucket.take():
                await on_db(market().workload_state)(node_id=self.node_id, frame=frame)
            else:
                await self._drop("workload")
        elif kind == "logs":
            if self.logs_bucket.take():
                await on_db(market().workload_output)(node_id=self.node_id, frame=frame)
            else:
                await self._drop("logs")
        else:
            await self._refuse(protocol.E_BAD_FRAME, f"agents may not send {kind!r} frames")

    async def _refuse(self, code: str, message: str, *, close: bool = False) -> None:
        self.bad_frames += 1
        await self._error(code, message)
        if close or self.bad_frames >= MAX_BAD_FRAMES:
            await self.close(code=CLOSE_BAD_FRAME, reason="bad frames")

    async def _drop(self, kind: str) -> None:
        """A frame over this socket's rate: refused and dropped; persistent flooding closes the socket."""
        await self._error(protocol.E_RATE_LIMITED, f"{kind} frame over this connection's rate limit: dropped")
        if self.drops.drop():
            log.warning("closing the agent socket of node %s: it keeps sending over its rate limits", self.node_label)
            await self.close(code=CLOSE_BAD_FRAME, reason="over the rate limits")

    async def _event(self, frame: dict) -> None:
        if not self.event_bucket.take():
            await self._drop("event")
            return
        detail = frame.get("detail") or {}
        size = len(json.dumps(detail, separators=(",", ":")).encode())
        if size > self.event_detail_max:
            await self._refuse(protocol.E_BAD_FRAME, f"event detail is {size} bytes; at most "
                                                     f"{self.event_detail_max} are accepted")
            return
        await on_db(health_services.health_event_record)(
            node_id=self.node_id, gpu_uuid=frame.get("gpu_uuid"), kind=frame["kind"],
            message=str(detail.get("message", frame["kind"])), detail=detail)

    async def _hello(self, frame: dict) -> None:
        # Join the node's agent group before reading its open commands: a command committed in between
        # would otherwise be sent to an empty group and wait for the next reconnect. Channel messages are
        # handled after this frame, so they still follow the welcome; one sent both ways is answered once.
        await self.channel_layer.group_add(agent_group(self.node_id), self.channel_name)
        try:
            state = await on_db(_apply_hello)(self.node_id, frame, self.token_hash, self.session)
        except DomainError as exc:
            await self._error(exc.code, exc.message)
            await self.close(code=CLOSE_FOR_STATUS.get(exc.status, CLOSE_BAD_FRAME), reason=exc.code)
            return
        self.gpu_ids, self.cordoned, open_commands, self.last_dbe, self.tdp_w = state
        self.ready = True
        # Two sockets for one node (a stale one, or the same token on a second machine) would both write its
        # metrics and both answer its commands: the newest socket wins, in any web process. The session number
        # orders them: an older socket's announcement, arriving late, closes nothing.
        await self.channel_layer.group_send(agent_group(self.node_id), {
            "type": "agent.replaced", "by": self.channel_name, "session": self.session})
        await self.send(text_data=protocol.encode(protocol.welcome(
            node_id=str(self.node_id), metrics_interval=settings.FLEET["METRICS_INTERVAL_SECONDS"],
            heartbeat_timeout=settings.FLEET["HEARTBEAT_TIMEOUT_SECONDS"])))
        for cmd in open_commands:  # the agent answers a command id it already ran without redoing it
            await self.send(text_data=protocol.encode(cmd))
        log.info("agent for node %s connected with %d GPUs", self.node_label, len(self.gpu_ids))

    async def _metrics(self, frame: dict) -> None:
        now = time.time()
        samples = []
        for sample in frame["gpus"]:
            gpu_id = self.gpu_ids.get(sample["uuid"])
            if gpu_id is None:
                # Not a GPU of this node: the whole batch is refused so nothing of it is written.
                await self._refuse(protocol.E_FORBIDDEN, f"GPU {sample['uuid']} is not on this node")
                return
            samples.append((gpu_id, sample))
        INGEST.add(node_id=self.node_id, ts=now, samples=samples)
        # Encoded once here rather than deep-copied by the layer and re-encoded by every subscriber.
        text = dumps({"type": "metrics", "node": self.node_key, "ts": now, "sent": frame["ts"],
                      "gpus": frame["gpus"]})
        await self.channel_layer.group_send(self.console_group, {"type": "node.metrics", "node": self.node_key,
                                                                 "text": text})
        for sample in frame["gpus"]:
            if sample.get("xid"):
                # Every XID is kept (by code) for the reliability score, whether or not it cordons the GPU.
                codes = sorted(set(sample["xid"]))
                await on_db(health_services.health_event_record)(
                    node_id=self.node_id, gpu_uuid=sample["uuid"], kind="xid",
                    message="XID " + ", ".join(map(str, codes)), detail={"codes": codes})
            reasons = self._health(sample)
            if reasons and sample["uuid"] not in self.cordoned:
                self.cordoned.add(sample["uuid"])
                await on_db(health_services.gpu_cordon)(gpu_id=self.gpu_ids[sample["uuid"]],
                                                                         reason="; ".join(reasons))

    def _health(self, sample: dict) -> list[str]:
        """Why this sample cordons its GPU (health_services.sample_violations), keeping the per-GPU ECC
        baseline and power streak. A sample with nothing near a threshold (nearly all) is answered without
        building the reasons: the same answer, [], at a fraction of the cost on the metrics path."""
        uuid, t = sample["uuid"], self.thresholds
        tdp_w = self.tdp_w.get(uuid)
        streak = self.power_streak.get(uuid, 0)
        over_power = health_services.power_over_limit(sample, t, tdp_w=tdp_w)
        temp, dbe = sample.get("temp_c"), sample.get("ecc_dbe")
        if ((temp is None or temp < t.max_temperature_c) and not over_power and not sample.get("xid")
                and (dbe is None or dbe <= t.max_ecc_dbe)):
            reasons = []
        else:
            reasons = health_services.sample_violations(sample, t, previous_dbe=self.last_dbe.get(uuid),
                                                        tdp_w=tdp_w, samples_over_power=streak)
        if dbe is not None:
            self.last_dbe[uuid] = dbe
        if tdp_w is not None:
            self.power_streak[uuid] = streak + 1 if over_power else 0
        return reasons

    # --- messages from the channel layer ------------------------------------------------------------
    async def agent_command(self, message: dict) -> None:
        if not self.ready or self.closed:
            return  # a hello that was refused, or a closed socket: the command stays open for the next session
        frame = message["frame"]
        await self.send(text_data=protocol.encode(frame))
        await on_db(command_services.commands_mark_sent)(
            command_ids=[frame["id"]], at=timezone.now())

    async def agent_revoked(self, message: dict) -> None:
        """The node's token was rotated (this socket authenticated with the old one), or the node was deleted."""
        why = message.get("why", "rotated")
        await self._error(protocol.E_UNAUTHORISED, REVOKED_SAID.get(why, REVOKED_SAID["rotated"]))
        await self.close(code=CLOSE_UNAUTHORISED, reason="node deleted" if why == "deleted" else "token rotated")

    async def agent_replaced(self, message: dict) -> None:
        """A newer socket of this node had its hello accepted: this one stops speaking for the node."""
        if message.get("by") == self.channel_name or not self.ready or self.closed:
            return  # our own announcement, or a socket whose hello is still pending (its own turn comes)
        if message.get("session", self.session + 1) <= self.session:
            return  # an older socket's announcement, late: its hello was refused or it was replaced itself
        self.ready = False
        await on_db(health_services.health_event_record)(
            node_id=self.node_id, gpu_uuid=None, kind="replaced",
            message="agent socket replaced by a newer connection of this node", detail={})
        await self._error(protocol.E_REPLACED, "replaced by a newer connection of this node; is its token "
                                               "used on two machines?")
        await self.close(code=CLOSE_REPLACED, reason="replaced")

    async def agent_resync(self, message: dict) -> None:
        """An operator uncordoned a GPU: forget the local cordon so new violations count again."""
        self.cordoned.discard(message.get("gpu_uuid"))


def _apply_hello(node_id, frame: dict, token_hash: str | None = None, session: int | None = None):
    from scheduler.models import Gpu

    node = node_services.node_hello(node_id=node_id, frame=frame, token_hash=token_hash, session=session)
    # The containers of leases the agent found: the market adopts or removes them.
    market().workloads_found(node_id=node_id, found=frame.get("workloads") or [])
    gpus = list(Gpu.objects.filter(node=node, present=True).values_list("uuid", "pk", "health", "latest__ecc_dbe",
                                                                        "gpu_model__tdp_w"))
    # The last stored ECC count is the baseline: an operator's uncordon holds across a reconnect until the
    # count grows (starting from nothing, the first sample would cordon the GPU again).
    return ({u: pk for u, pk, *_ in gpus}, {u for u, _, h, *_ in gpus if h == Gpu.Health.CORDONED},
            command_services.commands_open_for(node_id=node_id),
            {u: dbe for u, _, _, dbe, _ in gpus if dbe is not None},
            {u: tdp for u, *_, tdp in gpus if tdp})
