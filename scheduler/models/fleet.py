"""The supply inventory: nodes (a provider's server running an agent), their GPUs and the slices on them."""
import json
import uuid

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from nodeagent.hardware import mig as core_mig
from scheduler.core.filters import image_allowed
from scheduler.core.slots import Slots


_GEOMETRIES: dict[str, core_mig.MigGeometry] = {}  # canonical JSON -> parsed, shared


class Node(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "waiting for its agent"
        ONLINE = "online", "online"
        OFFLINE = "offline", "offline"
        DRAINING = "draining", "draining"
        # Its provider deleted it (scheduler.services.nodes.node_delete): its token works no more, it is in no list
        # and takes no work; the row stays for the leases, usage and earnings that name it.
        DELETED = "deleted", "deleted"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    provider = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="nodes", on_delete=models.PROTECT)
    name = models.CharField(max_length=80)
    region = models.CharField(max_length=40, default="eu-west")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True)
    # Only the hash of the agent token is kept; the token itself is shown once when issued.
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_prefix = models.CharField(max_length=12, editable=False, help_text="first characters, to recognise it")
    hostname = models.CharField(max_length=255, blank=True)
    driver_version = models.CharField(max_length=40, blank=True)
    cuda_version = models.CharField(max_length=20, blank=True)
    agent_version = models.CharField(max_length=40, blank=True)
    backend = models.CharField(max_length=20, blank=True)
    price_per_gpu_hour = models.DecimalField(max_digits=10, decimal_places=4, default=2,
                                             help_text="provider's base price for one whole GPU-hour (USD)")
    reliability = models.FloatField(default=1.0, help_text="reliability score 0..1 (docs/operations.md)")
    # The score taken apart (scheduler.core.reliability.Score.to_dict): each component's value, weight and the
    # events behind it, as of reliability_at.
    reliability_detail = models.JSONField(default=dict, blank=True, editable=False)
    reliability_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Kept apart from status: a draining node that goes offline must come back draining, not online.
    drain_requested = models.BooleanField(default=False, help_text="drained by its provider or an operator")
    # Who drained it (empty while it takes work): an operator's drain is lifted only by an operator, like a cordon.
    drained_by = models.CharField(max_length=10, choices=[("provider", "its provider"), ("operator", "an operator")],
                                  blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True, db_index=True)
    connected_at = models.DateTimeField(null=True, blank=True)
    # Agent sockets in the order they authenticated, and the one whose hello was accepted last: only a newer
    # socket may take over from the one speaking for the node (an older socket's late hello is refused).
    agent_sockets_opened = models.PositiveBigIntegerField(default=0, editable=False)
    agent_session = models.PositiveBigIntegerField(default=0, editable=False,
                                                   help_text="the agent socket that speaks for the node")
    created_at = models.DateTimeField(auto_now_add=True)
    # Workloads (the containers of leases): what the agent runs them on, and the provider's terms for them.
    runtime = models.CharField(max_length=40, blank=True, help_text="as its agent reported: docker, simulated, none")
    public_address = models.CharField(max_length=255, blank=True,
                                      help_text="where buyers reach the node's published ports (default its hostname)")
    port_range_start = models.PositiveIntegerField(default=20000, help_text="host ports given to containers (keep them outside the host's ephemeral range)")
    port_range_end = models.PositiveIntegerField(default=20999)
    cpus_per_gpu = models.DecimalField(max_digits=6, decimal_places=2, default=8,
                                       help_text="CPUs a whole GPU's container gets; a slice gets its share")
    ram_gb_per_gpu = models.DecimalField(max_digits=8, decimal_places=2, default=64,
                                         help_text="RAM (GB) a whole GPU's container gets; a slice gets its share")
    image_allowlist = models.JSONField(default=list, blank=True,
                                       help_text="image reference prefixes buyers may run here; empty: any")

    class Meta:
        ordering = ["name"]
        constraints = [
            # A deleted node's name is free for a new one.
            models.UniqueConstraint(fields=["provider", "name"], condition=~Q(status="deleted"),
                                    name="node_unique_name_per_provider"),
            models.CheckConstraint(condition=Q(port_range_start__gte=1024) & Q(port_range_end__lte=65535)
                                   & Q(port_range_end__gte=F("port_range_start")), name="node_port_range_valid"),
            models.CheckConstraint(condition=Q(price_per_gpu_hour__gte=0), name="node_price_nonnegative"),
            models.CheckConstraint(condition=Q(reliability__gte=0) & Q(reliability__lte=1),
                                   name="node_reliability_share"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def address(self) -> str:
        """Where buyers reach this node's published ports."""
        return self.public_address or self.hostname

    @property
    def runs_containers(self) -> bool:
        """Its agent has a container runtime (a real engine, or the simulated one of a demo)."""
        return self.runtime in CONTAINER_RUNTIMES

    def allows_image(self, image: str) -> bool:
        """An empty allow-list allows every image; else the reference (written out in full) must start with one
        of its prefixes."""
        return image_allowed(image, self.image_allowlist)


CONTAINER_RUNTIMES = ("docker", "simulated")  # what an agent may report that runs containers


class Gpu(models.Model):
    class Health(models.TextChoices):
        HEALTHY = "healthy", "healthy"
        DEGRADED = "degraded", "degraded"
        CORDONED = "cordoned", "cordoned"

    node = models.ForeignKey(Node, related_name="gpus", on_delete=models.CASCADE)
    uuid = models.CharField(max_length=80, unique=True)
    index = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=80, help_text="as the driver reports it")
    gpu_model = models.ForeignKey("scheduler.GpuModel", null=True, blank=True, on_delete=models.PROTECT,
                                  related_name="gpus")
    memory_mib = models.PositiveIntegerField()
    mig_enabled = models.BooleanField(default=False)
    # The geometry the agent reported (MigGeometry.to_dict()); what the server plans with.
    mig_geometry = models.JSONField(null=True, blank=True)
    health = models.CharField(max_length=10, choices=Health.choices, default=Health.HEALTHY, db_index=True)
    health_reason = models.CharField(max_length=200, blank=True)

    class CordonedBy(models.TextChoices):
        HEALTH = "health", "the health check"
        PROVIDER = "provider", "its provider"
        OPERATOR = "operator", "an operator"

    # Who cordoned it (empty while it is in service): an operator's cordon is lifted only by an operator.
    cordoned_by = models.CharField(max_length=10, choices=CordonedBy.choices, blank=True)
    present = models.BooleanField(default=True, help_text="false once the agent stops reporting this GPU")
    reliability = models.FloatField(null=True, blank=True, editable=False,
                                    help_text="this GPU's reliability score 0..1 (empty until scored: its node's counts)")
    reliability_detail = models.JSONField(default=dict, blank=True, editable=False)

    class Meta:
        ordering = ["node", "index"]
        verbose_name, verbose_name_plural = "GPU", "GPUs"
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node"),
                       models.CheckConstraint(condition=Q(reliability__gte=0) & Q(reliability__lte=1),
                                              name="gpu_reliability_share")]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index} ({self.name})"

    def geometry(self) -> core_mig.MigGeometry | None:
        """The MIG geometry the agent reported (None with MIG off). GPUs that report the same geometry share one
        immutable object: a snapshot of 10,000 GPUs holds a handful, not 10,000 copies for the collector."""
        if not self.mig_enabled or not self.mig_geometry:
            return None
        key = json.dumps(self.mig_geometry, sort_keys=True)
        geometry = _GEOMETRIES.get(key)
        if geometry is None:
            if len(_GEOMETRIES) > 256:
                _GEOMETRIES.clear()
            geometry = _GEOMETRIES[key] = core_mig.MigGeometry.from_dict(self.mig_geometry)
        return geometry


class Slice(models.Model):
    """What a lease runs on: a MIG GPU instance (profile + placement) or a whole GPU."""

    class State(models.TextChoices):
        CREATING = "creating", "creating"
        READY = "ready", "ready"
        DESTROYING = "destroying", "destroying"
        DESTROYED = "destroyed", "destroyed"
        FAILED = "failed", "failed"

    ACTIVE_STATES = (State.CREATING, State.READY, State.DESTROYING)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    gpu = models.ForeignKey(Gpu, related_name="slices", on_delete=models.PROTECT)
    profile = models.CharField(max_length=30, blank=True, help_text="MIG profile; empty = the whole GPU")
    start = models.PositiveSmallIntegerField(default=0)
    size = models.PositiveSmallIntegerField(default=0, help_text="memory slices held (0 for a whole non-MIG GPU)")
    state = models.CharField(max_length=12, choices=State.choices, default=State.CREATING, db_index=True)
    instance_uuid = models.CharField(max_length=80, blank=True, help_text="MIG device UUID once created")
    error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["gpu", "start"]
        constraints = [
            models.UniqueConstraint(fields=["instance_uuid"], condition=~Q(instance_uuid=""),
                                    name="slice_unique_instance_uuid"),
        ]

    def __str__(self) -> str:
        return f"{self.profile or 'whole GPU'}@{self.start} on {self.gpu}"

    @property
    def is_whole_gpu(self) -> bool:
        return not self.profile

    @property
    def slots(self) -> Slots:
        """The memory slices it holds (scheduler.core.slots: a whole non-MIG GPU holds every slot)."""
        return Slots.sized(self.start, self.size)

    @property
    def cuda_visible_devices(self) -> str:
        """What the buyer's process sets CUDA_VISIBLE_DEVICES to (a MIG UUID or the GPU UUID)."""
        return self.instance_uuid or self.gpu.uuid


class AgentCommand(models.Model):
    """A command sent to a node's agent; idempotent by id on the agent, answered by a result."""

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        SENT = "sent", "sent"
        SUCCEEDED = "succeeded", "succeeded"
        FAILED = "failed", "failed"
        TIMED_OUT = "timed_out", "timed out"

    OPEN_STATES = (State.PENDING, State.SENT)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node = models.ForeignKey(Node, related_name="commands", on_delete=models.CASCADE)
    slice = models.ForeignKey(Slice, null=True, blank=True, related_name="commands", on_delete=models.SET_NULL)
    op = models.CharField(max_length=30)
    args = models.JSONField(default=dict)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING, db_index=True)
    result = models.JSONField(null=True, blank=True)
    error_code = models.CharField(max_length=40, blank=True)
    error_message = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["state", "deadline"])]

    def __str__(self) -> str:
        return f"{self.op} → {self.node} ({self.state})"

    def args_shown(self) -> dict:
        """The arguments as they may be shown (the admin): a workload's secret environment values masked."""
        spec = (self.args or {}).get("spec")
        if not isinstance(spec, dict) or not spec.get("secret_names"):
            return self.args
        env = {k: "********" if k in spec["secret_names"] else v for k, v in (spec.get("env") or {}).items()}
        return {**self.args, "spec": {**spec, "env": env}}


class HealthEvent(models.Model):
    """What happened to a node or GPU: XIDs, threshold crossings, cordons, going offline."""

    node = models.ForeignKey(Node, related_name="health_events", on_delete=models.CASCADE)
    gpu = models.ForeignKey(Gpu, null=True, blank=True, related_name="health_events", on_delete=models.CASCADE)
    kind = models.CharField(max_length=30, db_index=True)
    message = models.CharField(max_length=300)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class OutboxEvent(models.Model):
    """A channel-layer message written by a process that cannot reach the layer itself.

    With the embedded default the channel layer lives inside the web process, so a Celery worker or beat
    cannot group_send to agents or browsers: they write here and the web process relays (gateway/relay.py).
    With Redis every process sends directly and this table stays empty.
    """

    group = models.CharField(max_length=120)
    message = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.group}: {self.message.get('type')}"
