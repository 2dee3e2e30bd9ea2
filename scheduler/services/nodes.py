"""Services that write nodes: registration, renaming and deletion, the agent's hello (inventory upsert), heartbeats,
offline, drain."""
from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from nodeagent.hardware import gpus as core_gpus, mig as core_mig
from scheduler.errors import Conflict, DomainError, PermissionDenied
from scheduler.models import AgentCommand, Gpu, GpuModel, HealthEvent, Node, Slice
from scheduler.ports import market
from scheduler.selectors import node_holders

from .events import announce_node, tell_agent_token_revoked
from .tokens import token_hash, token_new

log = logging.getLogger(__name__)
MAX_NAME = 80
# A socket that closes and is followed by the node's next hello within this many seconds is one blip in the
# node's history: the "disconnected" event becomes a single "reconnected" one instead of a pair.
RECONNECT_WINDOW_SECONDS = 10.0
CONNECTION_EVENTS = ("connected", "reconnected", "disconnected")


def _node_name(name: str) -> str:
    name = (name or "").strip()
    if not name or len(name) > MAX_NAME:
        raise DomainError(f"a node needs a name of 1 to {MAX_NAME} characters", field="name")
    return name


def node_register(*, provider, name: str, region: str = "eu-west",
                  price_per_gpu_hour: Decimal | str | None = None) -> tuple[Node, str]:
    """Create a node for `provider`; returns the node and its agent token (shown once, only its hash is kept).

    Only providers register nodes. The rule is checked here, in the one service every way in calls (console, API,
    scripts, the demo's seed), not in each interface; roles belong to the market's accounts, which the fleet must
    not import, so it asks through its port (scheduler/ports.py), as it asks who holds a slice. Without a market
    (the fleet alone) nobody is refused."""
    refusal = market().provider_refusal(user=provider)
    if refusal:
        raise PermissionDenied(refusal, code="not_a_provider")
    name = _node_name(name)
    region = (region or "").strip()
    if not region or len(region) > 40:
        raise DomainError("a node needs a region of 1 to 40 characters", field="region")
    price = Decimal("2.00") if price_per_gpu_hour in (None, "") else _price(price_per_gpu_hour)
    token = token_new()
    try:
        with transaction.atomic():
            node = Node.objects.create(provider=provider, name=name, region=region, price_per_gpu_hour=price,
                                       token_hash=token_hash(token), token_prefix=token[:12])
    except IntegrityError:
        raise Conflict(f"you already have a node named {name!r}", field="name") from None
    return node, token


def _price(value) -> Decimal:
    try:
        price = Decimal(str(value))
    except Exception:
        raise DomainError("price_per_gpu_hour must be a decimal number", field="price_per_gpu_hour") from None
    if not price.is_finite() or price < 0 or price > Decimal("1000"):
        raise DomainError("price_per_gpu_hour must be between 0 and 1000", field="price_per_gpu_hour")
    return price.quantize(Decimal("0.0001"))


def node_rotate_token(*, node: Node) -> str:
    """Issue a new agent token for `node`; the old one stops working at once, and an agent connected
    with it is disconnected (a token is rotated because it leaked: a live socket must not outlast it)."""
    token = token_new()
    Node.objects.filter(pk=node.pk).update(token_hash=token_hash(token), token_prefix=token[:12])
    node.token_hash, node.token_prefix = token_hash(token), token[:12]
    transaction.on_commit(lambda: tell_agent_token_revoked(node.pk))
    return token


def node_rename(*, node: Node, name: str) -> Node:
    """Give `node` another name, unique among its provider's nodes (Conflict naming the field otherwise)."""
    name = _node_name(name)
    try:
        with transaction.atomic():
            Node.objects.filter(pk=node.pk).update(name=name)
    except IntegrityError:
        raise Conflict(f"you already have a node named {name!r}", field="name") from None
    node.name = name
    return node


def node_delete(*, node: Node, by: str = "its provider") -> Node:
    """Delete `node`. Refused (Conflict, code "node_busy", naming them) while a buyer's lease runs on it or a
    reservation holds a window of it: drain it and delete it once they have ended. Otherwise its token stops working
    at once, an agent still connected is told why and disconnected (close 4401: it stops), instances no lease holds
    are forgotten, and it leaves every list and placement with its GPUs (an agent reinstalled on another of the
    provider's nodes takes them along). The row stays, status "deleted", for the leases, usage and earnings that name
    it; its name is free for a new node. Deleting a deleted node changes nothing."""
    now = timezone.now()
    with transaction.atomic():
        # Lock the node, and only the node. The race is an order or a booking claiming a slice or a window on its
        # GPUs meanwhile: a claim locks its GPU, then the node, and re-checks the node's status; so a claim that
        # got here first has committed its lease (counted below), and one that comes after finds the node
        # deleted and looks elsewhere. Locking (or writing) the GPUs here too would take them in the opposite
        # order to the claims: a deadlock. A hello bringing the node back waits too, and is refused.
        node = Node.objects.select_for_update().get(pk=node.pk)
        if node.status == Node.Status.DELETED:
            return node
        held = node_holders(node=node)
        if held:
            raise Conflict(f"{node.name} still has {held}: drain it, and delete it once they have ended",
                           code="node_busy")
        for sl in Slice.objects.select_for_update(of=("self",)).filter(gpu__node=node, state__in=Slice.ACTIVE_STATES):
            sl.state, sl.ended_at, sl.error = Slice.State.DESTROYED, now, "its node was deleted"
            sl.save(update_fields=["state", "ended_at", "error"])
        # A hash of a token nobody was given: the old token, and any agent holding it, is refused from now on.
        node.status, node.token_hash, node.token_prefix = Node.Status.DELETED, token_hash(token_new()), ""
        node.save(update_fields=["status", "token_hash", "token_prefix"])
        HealthEvent.objects.create(node=node, kind="deleted", message=f"node deleted by {by}")
        transaction.on_commit(lambda: tell_agent_token_revoked(node.pk, why="deleted"))
        transaction.on_commit(lambda: announce_node(node.pk, {"status": Node.Status.DELETED}))
    return node


def node_for_token(*, token: str) -> Node | None:
    if not token or len(token) > 200:
        return None
    return Node.objects.filter(token_hash=token_hash(token)).exclude(status=Node.Status.DELETED).first()


def node_agent_connect(*, token: str) -> tuple[Node, int] | None:
    """The node `token` belongs to and this socket's session number, larger than that of every socket of the
    node before it (None for an unknown token). Hellos are ordered by it: see node_hello's `session`."""
    node = node_for_token(token=token)
    if node is None:
        return None
    with transaction.atomic():
        # An increment in the database: two sockets connecting at once (any web process) get distinct numbers.
        Node.objects.filter(pk=node.pk).update(agent_sockets_opened=F("agent_sockets_opened") + 1)
        session = Node.objects.filter(pk=node.pk).values_list("agent_sockets_opened", flat=True).get()
    return node, session


def node_hello(*, node_id, frame: dict, token_hash: str | None = None, session: int | None = None) -> Node:
    """Apply an agent's hello (already validated by nodeagent.protocol): node facts and its GPU inventory.

    The geometry the agent reports is what the server plans with. A GPU uuid that belongs to another
    node is refused and nothing is written (an agent can never write another node's records), except a
    GPU of an offline node of the same provider: it was reinstalled here, and moves with its history. With
    `token_hash` (the one the socket authenticated with), a token rotated since is refused too. With
    `session` (node_agent_connect's number for the socket), a hello from an older socket than the one whose
    hello was accepted last is refused (Conflict, code "replaced"): the newest socket speaks for the node.
    """
    now = timezone.now()
    reported = {g["uuid"]: g for g in frame["gpus"]}
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.status == Node.Status.DELETED:
            raise DomainError("this node was deleted by its provider", code="unauthorised", status=401)
        if token_hash is not None and node.token_hash != token_hash:
            raise DomainError("this node's token was rotated; start the agent with the new one",
                              code="unauthorised", status=401)
        # Under the node's row lock: the race is an older socket's late hello (a backlog still being worked
        # through, or another web process) landing after a newer socket's was accepted.
        if session is not None and session < node.agent_session:
            raise Conflict("a newer connection of this node was accepted; this one is closed", code="replaced")
        # Lock the GPUs claimed from other nodes: the race is two hellos both moving the same GPU.
        foreign = list(Gpu.objects.select_for_update().filter(uuid__in=reported).exclude(node=node)
                       .select_related("node").order_by("uuid"))
        refused = [g.uuid for g in foreign if not _may_move(g, to=node)]
        if refused:
            raise PermissionDenied(f"GPU {refused[0]} belongs to another node", code="forbidden")
        for gpu in foreign:
            # Reinstalled in another server of the same provider: the record (health, metrics) follows it.
            old_node = gpu.node
            gpu.node = node
            _save_gpu_index_safely(gpu)
            HealthEvent.objects.bulk_create([
                HealthEvent(node=old_node, gpu=gpu, kind="gpu_moved", message=f"GPU {gpu.uuid} moved to {node.name}"),
                HealthEvent(node=node, gpu=gpu, kind="gpu_moved", message=f"GPU {gpu.uuid} moved here from "
                                                                         f"{old_node.name} ({old_node.status})")])
        geometries = {uuid: _geometry_of(g) for uuid, g in reported.items()}
        node.hostname = frame["hostname"][:255]
        node.driver_version = frame["driver_version"][:40]
        node.cuda_version = frame["cuda_version"][:20]
        node.agent_version = frame["agent_version"][:40]
        node.backend = frame["backend"][:20]
        node.runtime = (frame.get("runtime") or "")[:40]  # an agent that predates workloads runs none
        was = node.status
        node.status = Node.Status.DRAINING if node.drain_requested else Node.Status.ONLINE
        node.connected_at = node.last_heartbeat = now
        if session is not None:
            node.agent_session = session
        node.save()
        models_by_key = {m.key: m for m in GpuModel.objects.all()}
        existing = {g.uuid: g for g in Gpu.objects.filter(node=node)}
        for uuid, g in reported.items():
            key = g.get("model") or core_gpus.key_for_gpu(g["name"], g["memory_mib"])
            gpu = existing.get(uuid) or Gpu(node=node, uuid=uuid)
            gpu.index = int(g["index"])
            gpu.name = g["name"][:80]
            gpu.gpu_model = models_by_key.get(key or "")
            gpu.memory_mib = int(g["memory_mib"])
            gpu.mig_enabled = bool(g["mig_enabled"]) and geometries[uuid] is not None
            gpu.mig_geometry = geometries[uuid].to_dict() if geometries[uuid] else None
            gpu.present = True
            _save_gpu_index_safely(gpu)
            _reconcile_instances(gpu=gpu, geometry=geometries[uuid], reported=g.get("instances") or [], now=now)
        Gpu.objects.filter(node=node).exclude(uuid__in=reported).update(present=False)
        _connection_record(node=node, now=now, gpus=len(reported))
    if node.status != was:  # a reconnect that changes nothing tells the consoles nothing
        transaction.on_commit(lambda: announce_node(node.pk, {"status": node.status}))
    return node


def _connection_record(*, node: Node, now: datetime, gpus: int) -> None:
    """A "connected" health event, or, when the node's socket closed moments ago, its "disconnected" event
    turned into one "reconnected" (an agent that reconnects every few seconds writes one event per blip)."""
    what = f"agent {node.agent_version} ({node.backend}) with {gpus} GPUs"
    last = (HealthEvent.objects.filter(node=node, kind__in=CONNECTION_EVENTS).order_by("-created_at", "-pk")
            .first())
    if last is not None and last.kind == "disconnected" and (
            gap := (now - last.created_at).total_seconds()) <= RECONNECT_WINDOW_SECONDS:
        last.kind = "reconnected"
        closed = _close_said(**{k: last.detail.get(k) for k in ("code", "reason", "by")})
        last.message = f"{what} reconnected {max(gap, 0):.1f} s after its socket closed ({closed})"[:300]
        last.detail = {**last.detail, "reconnected_after_seconds": round(max(gap, 0), 3)}
        last.save(update_fields=["kind", "message", "detail"])
    else:
        HealthEvent.objects.create(node=node, kind="connected", message=f"{what} connected")


def _may_move(gpu: Gpu, *, to: Node) -> bool:
    """A GPU claimed by `to`'s hello may leave its node only for a node of the same provider, and only while
    its node is offline or deleted (both up would mean one GPU in two servers: a copied inventory, not a move)."""
    return gpu.node.provider_id == to.provider_id and gpu.node.status in (Node.Status.OFFLINE, Node.Status.DELETED)


def gpu_release(*, gpu_id: int, by: str = "operator") -> Gpu:
    """Free a dead node's GPU uuid so another node (of any provider) may claim it; the record and its history
    stay with the old node under a renamed uuid. Refused while the node is not offline."""
    now = timezone.now()
    with transaction.atomic():
        gpu = Gpu.objects.select_for_update().select_related("node").get(pk=gpu_id)
        if gpu.node.status != Node.Status.OFFLINE:
            raise Conflict(f"{gpu} is on a node that is {gpu.node.status}; only a dead (offline) node's GPU can be "
                           f"released", code="node_not_offline")
        original = gpu.uuid
        gpu.uuid, gpu.present = f"released-{gpu.pk}-{original}"[:80], False
        gpu.save(update_fields=["uuid", "present"])
        # Its instances went with the node: the capacity they held is gone.
        for sl in Slice.objects.select_for_update().filter(gpu=gpu, state__in=Slice.ACTIVE_STATES):
            sl.state, sl.ended_at, sl.error = Slice.State.DESTROYED, now, "GPU released from a dead node"
            sl.save(update_fields=["state", "ended_at", "error"])
            market().slice_destroyed(sl=sl, at=now)
        HealthEvent.objects.create(node=gpu.node, gpu=gpu, kind="released",
                                   message=f"GPU {original} released by {by}", detail={"uuid": original})
    return gpu


def _save_gpu_index_safely(gpu: Gpu) -> None:
    # Indices may move between GPUs across reboots, and (node, index) is unique.
    clash = Gpu.objects.filter(node=gpu.node, index=gpu.index).exclude(uuid=gpu.uuid).first()
    if clash is not None:
        # The GPU that held this index is gone or renumbered: park it on a free high index.
        used = set(Gpu.objects.filter(node=gpu.node).values_list("index", flat=True))
        clash.index = next(i for i in range(1000, 2000) if i not in used)
        clash.save(update_fields=["index"])
    gpu.save()


def _geometry_of(g: dict) -> core_mig.MigGeometry | None:
    if not g.get("mig_enabled") or not g.get("mig"):
        return None
    try:
        return core_mig.MigGeometry.from_dict(g["mig"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DomainError(f"GPU {g['uuid']}: MIG geometry is not valid: {exc}", code="bad_frame") from None


def _reconcile_instances(*, gpu: Gpu, geometry, reported: list[dict], now: datetime) -> None:
    """Make the server's slices agree with the instances the agent found on the GPU."""
    from .slices import slice_destroy_command, slice_found_carved

    seen = {i["uuid"]: i for i in reported}
    active = Slice.objects.filter(gpu=gpu, state__in=Slice.ACTIVE_STATES)
    for sl in active:
        if sl.instance_uuid and sl.instance_uuid not in seen and sl.state == Slice.State.READY:
            sl.state, sl.ended_at = Slice.State.FAILED, now
            sl.error = "instance not reported by the agent after reconnecting"
            sl.save(update_fields=["state", "ended_at", "error"])
            market().slice_failed(sl=sl, at=now, reason=sl.error)  # its lease lost it
        elif sl.state == Slice.State.DESTROYING and sl.instance_uuid:
            # A destroy that timed out (the node was away) left the slice holding its memory slices.
            if sl.instance_uuid not in seen:
                sl.state, sl.ended_at = Slice.State.DESTROYED, now
                sl.save(update_fields=["state", "ended_at"])
                market().slice_destroyed(sl=sl, at=now)
            elif not sl.commands.filter(op="destroy_instance", state__in=AgentCommand.OPEN_STATES).exists():
                slice_destroy_command(sl)
    known = set(active.exclude(instance_uuid="").values_list("instance_uuid", flat=True))
    carving = {(sl.profile, sl.start): sl for sl in active.filter(state=Slice.State.CREATING, instance_uuid="")}
    for uuid, inst in seen.items():
        if uuid in known or geometry is None or not geometry.has_profile(inst["profile"]):
            continue
        being_carved = carving.pop((inst["profile"], int(inst["start"])), None)
        if being_carved is not None:
            slice_found_carved(sl=being_carved, instance_uuid=uuid, at=now)
            continue
        # An instance we did not create (made by hand on the host): adopt it so it is planned around.
        Slice.objects.create(gpu=gpu, profile=inst["profile"], start=int(inst["start"]),
                             size=geometry.profile(inst["profile"]).memory_slices, state=Slice.State.READY,
                             instance_uuid=uuid, ready_at=now, error="adopted: found on the GPU")


def nodes_heartbeat(*, node_ids, at: datetime) -> int:
    """Record that these nodes were heard from (one UPDATE for a whole flush); a node that was marked
    offline but is sending again comes back online."""
    ids = list(node_ids)
    with transaction.atomic():
        # Lock the offline ones: the race is the offline check marking a node offline again in between, or
        # two web processes both bringing it back (each would log and announce it).
        back = list(Node.objects.select_for_update().filter(pk__in=ids, status=Node.Status.OFFLINE)
                    .values_list("pk", "drain_requested"))
        if back:
            for drained, status in ((False, Node.Status.ONLINE), (True, Node.Status.DRAINING)):
                Node.objects.filter(pk__in=[pk for pk, d in back if d == drained]).update(status=status)
            HealthEvent.objects.bulk_create([
                HealthEvent(node_id=pk, kind="online", message="back online: heard from its agent again")
                for pk, _ in back])
            for pk, drained in back:
                status = Node.Status.DRAINING if drained else Node.Status.ONLINE
                transaction.on_commit(lambda pk=pk, status=status: announce_node(pk, {"status": status}))
        return Node.objects.filter(pk__in=ids).update(last_heartbeat=at)


def node_disconnected(*, node_id, session: int, code: int | None, reason: str = "", by: str = "agent") -> bool:
    """The socket of agent session `session` closed (`by` the agent or the server, with its close code and
    reason): a "disconnected" health event, unless a newer socket speaks for the node by now (it took over;
    nothing was lost). The node's status stays as it is until the heartbeat timeout says otherwise."""
    if not Node.objects.filter(pk=node_id, agent_session=session).exists():
        return False
    HealthEvent.objects.create(node_id=node_id, kind="disconnected",
                               message=f"agent socket closed ({_close_said(code=code, reason=reason, by=by)})"[:300],
                               detail={"code": code, "reason": reason[:200], "by": by})
    return True


def _close_said(*, code: int | None, reason: str | None, by: str | None) -> str:
    said = ("by the server, " if by == "server" else "") + (f"code {code}" if code is not None else "no close code")
    return f"{said}: {reason}" if reason else said


def nodes_mark_offline(*, now: datetime | None = None) -> list:
    """Mark online or draining nodes silent past the heartbeat timeout offline; returns their ids. Their leases
    stay (nodes_lose_leases ends them once the silence outlasts the grace). When at least OFFLINE_MASS_SHARE of
    the live fleet (2 nodes at least) fell silent at once, the platform is deaf, not the nodes (Redis or the web
    processes are down: liveness reaches us only through them): nobody is marked, and why is logged, until the
    silence outlasts the grace too."""
    now = now or timezone.now()
    timeout, grace = settings.FLEET["HEARTBEAT_TIMEOUT_SECONDS"], settings.FLEET["OFFLINE_LEASE_GRACE_SECONDS"]
    live = Node.objects.filter(status__in=[Node.Status.ONLINE, Node.Status.DRAINING])
    with transaction.atomic():
        stale = list(live.select_for_update(skip_locked=True).filter(last_heartbeat__lt=now - timedelta(seconds=timeout))
                     .values_list("pk", "last_heartbeat"))
        if len(stale) >= 2 and len(stale) >= settings.FLEET["OFFLINE_MASS_SHARE"] * live.count():
            held = [pk for pk, heard in stale if heard >= now - timedelta(seconds=timeout + grace)]
            if held:
                log.warning("%d of %d live nodes fell silent at once: the platform's own outage (Redis, the web "
                            "processes?), not theirs; none is marked offline for up to %g s more", len(stale),
                            live.count(), grace)
            stale = [(pk, heard) for pk, heard in stale if pk not in held]
        stale = [pk for pk, _ in stale]
        if not stale:
            return []
        Node.objects.filter(pk__in=stale).update(status=Node.Status.OFFLINE)
        HealthEvent.objects.bulk_create([
            HealthEvent(node_id=pk, kind="offline", message=f"no heartbeat for {timeout:g} s") for pk in stale])
    for pk in stale:
        transaction.on_commit(lambda pk=pk: announce_node(pk, {"status": Node.Status.OFFLINE}))
    return stale


def nodes_lose_leases(*, now: datetime | None = None) -> list:
    """Tell the market that offline nodes silent past the heartbeat timeout plus OFFLINE_LEASE_GRACE lost what
    runs on them, as of their last heartbeat; returns their ids. A node heard again within the grace keeps its
    leases (its hello reconciles the instances)."""
    now = now or timezone.now()
    silence = settings.FLEET["HEARTBEAT_TIMEOUT_SECONDS"] + settings.FLEET["OFFLINE_LEASE_GRACE_SECONDS"]
    cutoff = now - timedelta(seconds=silence)
    # Nodes with a slice still being carved or running (once their leases are lost, the slices are destroying, and
    # an instance adopted from the GPU holds no lease): each is told once, not at every check.
    holding = (Slice.objects.filter(state__in=[Slice.State.CREATING, Slice.State.READY],
                                    gpu__node__status=Node.Status.OFFLINE, gpu__node__last_heartbeat__lt=cutoff)
               .exclude(error__startswith="adopted").values_list("gpu__node_id", flat=True).distinct())
    lost = []
    for pk in list(holding):
        with transaction.atomic():
            # Lock the node: the race is its heartbeat bringing it back meanwhile (nodes_heartbeat locks it too).
            node = (Node.objects.select_for_update(skip_locked=True)
                    .filter(pk=pk, status=Node.Status.OFFLINE, last_heartbeat__lt=cutoff).first())
            if node is not None:
                market().node_offline(node_id=pk, at=node.last_heartbeat)
                lost.append(pk)
    return lost


def node_drain(*, node: Node, by_operator: bool = False) -> Node:
    """Stop placing new work on `node`; running slices stay until their leases end. An offline node stays
    offline and comes back draining. An operator's drain takes over a provider's (so the provider cannot lift it);
    a provider draining a node an operator drained changes nothing."""
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        drained_by = "operator" if by_operator or node.drained_by == "operator" else "provider"
        Node.objects.filter(pk=node.pk).update(drain_requested=True, drained_by=drained_by)
        Node.objects.filter(pk=node.pk).exclude(status__in=[Node.Status.DRAINING, Node.Status.OFFLINE]).update(
            status=Node.Status.DRAINING)
        node.refresh_from_db()
        HealthEvent.objects.create(node=node, kind="drain", message=f"node set to draining by {node.get_drained_by_display()}")
        transaction.on_commit(lambda: announce_node(node.pk, {"status": node.status}))
    return node


def node_undrain(*, node: Node, by_operator: bool = False) -> Node:
    """Take new work on `node` again. A drain an operator set is lifted only by an operator (403
    `drained_by_operator`): the provider is told to ask the operators."""
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        if node.drained_by == "operator" and not by_operator:
            raise PermissionDenied(f"{node.name} was drained by an operator: only an operator can put it back in "
                                   "service; contact the operators", code="drained_by_operator")
        Node.objects.filter(pk=node.pk).update(drain_requested=False, drained_by="")
        Node.objects.filter(pk=node.pk, status=Node.Status.DRAINING).update(status=Node.Status.ONLINE)
        node.refresh_from_db()
        transaction.on_commit(lambda: announce_node(node.pk, {"status": node.status}))
    return node


# What a provider sets for buyers' containers on a node (the API's serializer and the console's form read it).
NODE_SETTINGS_BOUNDS = {"cpus_per_gpu": (Decimal("0.1"), Decimal("1024")),
                        "ram_gb_per_gpu": (Decimal("0.25"), Decimal("65536")), "image_allowlist": 50}
ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.\-]{0,253}[A-Za-z0-9])?)$")


def node_settings_update(*, node: Node, name: str | None = None, public_address: str | None = None,
                         port_range_start: int | None = None, port_range_end: int | None = None,
                         cpus_per_gpu: Decimal | None = None, ram_gb_per_gpu: Decimal | None = None,
                         image_allowlist: list[str] | None = None) -> Node:
    """The provider's settings of `node`: its name (node_rename), and its terms for containers: where buyers reach
    it, the host ports it gives out, CPUs and RAM per whole GPU (a slice gets its share), the images it runs
    (reference prefixes; empty: any). A changed range applies to containers started from now on (running ones keep
    their ports). DomainError naming the field when a value is out of bounds; nothing is written then (one
    transaction)."""
    with transaction.atomic():
        if name is not None:
            node_rename(node=node, name=name)
        return _terms_update(node=node, public_address=public_address, port_range_start=port_range_start,
                             port_range_end=port_range_end, cpus_per_gpu=cpus_per_gpu, ram_gb_per_gpu=ram_gb_per_gpu,
                             image_allowlist=image_allowlist)


def _terms_update(*, node: Node, public_address: str | None, port_range_start: int | None,
                  port_range_end: int | None, cpus_per_gpu: Decimal | None, ram_gb_per_gpu: Decimal | None,
                  image_allowlist: list[str] | None) -> Node:
    if public_address is not None:
        public_address = public_address.strip()
        if public_address and not ADDRESS.match(public_address):
            raise DomainError(f"{public_address!r} is not a host name or an IP address", field="public_address")
        node.public_address = public_address
    start = node.port_range_start if port_range_start is None else port_range_start
    end = node.port_range_end if port_range_end is None else port_range_end
    if not 1024 <= start <= end <= 65535:
        raise DomainError("the port range is within 1024-65535 and ends at or after it starts",
                          field="port_range_start")
    node.port_range_start, node.port_range_end = start, end
    for name, value in (("cpus_per_gpu", cpus_per_gpu), ("ram_gb_per_gpu", ram_gb_per_gpu)):
        if value is None:
            continue
        low, high = NODE_SETTINGS_BOUNDS[name]
        if not low <= value <= high:
            raise DomainError(f"{name} is between {low} and {high}", field=name)
        setattr(node, name, value)
    if image_allowlist is not None:
        entries = [e.strip() for e in image_allowlist if e and e.strip()]
        if len(entries) > NODE_SETTINGS_BOUNDS["image_allowlist"] or any(
                len(e) > 300 or any(c.isspace() for c in e) for e in entries):
            raise DomainError(f"at most {NODE_SETTINGS_BOUNDS['image_allowlist']} image prefixes without spaces, "
                              f"like docker.io/library/ or ghcr.io/acme/", field="image_allowlist")
        node.image_allowlist = list(dict.fromkeys(entries))
    node.save(update_fields=["public_address", "port_range_start", "port_range_end", "cpus_per_gpu",
                             "ram_gb_per_gpu", "image_allowlist"])
    return node
