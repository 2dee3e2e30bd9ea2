"""Workloads: what runs on a lease. An order carries a `Workload` (image, command, environment, ports, disk, kind);
each of its leases gets a `WorkloadRun`, the container's life on the lease's slice (states reported by the agent,
the exit code, the tail of its output), and the host ports published for it (`PortBinding`, unique per node).
Operators curate `Template`s; buyers keep their SSH public keys (`SshKey`) on their account.

Environment values marked secret are kept here (the database) and sent to the node's agent, and never shown back,
logged or sent to a webhook (serializers and the admin mask them).
"""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

KIND_CHOICES = [("interactive", "interactive: runs for the lease"), ("job", "job: runs to completion")]
NOTICE_CHOICES = [("sigterm", "SIGTERM at the notice"), ("file", "a notice file at /run/gpumarket/notice")]


class Template(models.Model):
    """An operator-curated image preset the order form offers (PyTorch, Jupyter, an inference server, ...)."""

    key = models.SlugField(max_length=40, unique=True)
    name = models.CharField(max_length=80)
    description = models.CharField(max_length=300, blank=True)
    image = models.CharField(max_length=300)
    command = models.JSONField(default=list, blank=True, help_text="entrypoint to use instead of the image's")
    args = models.JSONField(default=list, blank=True, help_text="arguments to use instead of the image's command")
    env = models.JSONField(default=dict, blank=True, help_text="default environment (names to values)")
    ports = models.JSONField(default=list, blank=True,
                             help_text='published ports: [{"port": 22, "protocol": "tcp", "kind": "ssh"}]; kind ssh, '
                                       'http or tcp')
    disk_gb = models.PositiveIntegerField(default=20)
    kind = models.CharField(max_length=12, choices=KIND_CHOICES, default="interactive")
    jupyter = models.BooleanField(default=False, help_text="give each lease a Jupyter token (JUPYTER_TOKEN)")
    enabled = models.BooleanField(default=True)
    position = models.PositiveSmallIntegerField(default=100)

    class Meta:
        ordering = ["position", "name"]

    def __str__(self) -> str:
        return self.name


class SshKey(models.Model):
    """A buyer's SSH public key: every container of theirs lets it log in as root."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="ssh_keys", on_delete=models.CASCADE)
    name = models.CharField(max_length=80)
    public_key = models.TextField(max_length=16384)
    fingerprint = models.CharField(max_length=100, help_text="SHA256 of the key, as ssh-keygen -l shows it")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        verbose_name, verbose_name_plural = "SSH key", "SSH keys"
        constraints = [models.UniqueConstraint(fields=["user", "fingerprint"], name="sshkey_unique_per_user")]

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"


class Workload(models.Model):
    """What an order runs on each of its leases."""

    order = models.OneToOneField("marketplace.Order", related_name="workload", on_delete=models.CASCADE)
    template = models.ForeignKey(Template, null=True, blank=True, related_name="workloads", on_delete=models.SET_NULL)
    image = models.CharField(max_length=300)
    command = models.JSONField(default=list, blank=True)
    args = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=list, blank=True, help_text='[{"name", "value", "secret"}]')
    ports = models.JSONField(default=list, blank=True, help_text='[{"port", "protocol", "kind"}]')
    disk_gb = models.PositiveIntegerField(default=20)
    kind = models.CharField(max_length=12, choices=KIND_CHOICES, default="interactive")
    notice = models.CharField(max_length=8, choices=NOTICE_CHOICES, default="sigterm")
    jupyter_token = models.CharField(max_length=64, blank=True)

    def __str__(self) -> str:
        return f"{self.kind} {self.image}"

    def public_env(self) -> list[dict]:
        """The environment as it may be shown: secret values masked."""
        return [{"name": e["name"], "value": None if e.get("secret") else e["value"], "secret": bool(e.get("secret"))}
                for e in self.env]


class WorkloadRun(models.Model):
    """A lease's container: its state as the agent reported it, its exit and the tail of its output."""

    class State(models.TextChoices):
        PENDING = "pending", "waiting for its slice"
        PULLING = "pulling", "pulling the image"
        STARTING = "starting", "starting"
        RUNNING = "running", "running"
        EXITED = "exited", "exited"
        FAILED = "failed", "failed"
        STOPPING = "stopping", "stopping"
        REMOVED = "removed", "removed"

    DONE_STATES = (State.FAILED, State.REMOVED)

    lease = models.OneToOneField("marketplace.Lease", related_name="run", on_delete=models.CASCADE)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    container = models.CharField(max_length=128, blank=True)
    progress = models.CharField(max_length=300, blank=True)
    error = models.CharField(max_length=2000, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    log_tail = models.TextField(blank=True, help_text="the last WORKLOAD_LOG_TAIL_BYTES of its output")
    log_bytes = models.PositiveBigIntegerField(default=0, help_text="all the output it wrote")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"run of {self.lease_id} ({self.state})"

    @property
    def seconds(self) -> int | None:
        if self.started_at is None:
            return None
        return int((self.finished_at - self.started_at).total_seconds()) if self.finished_at else None


class PortBinding(models.Model):
    """A host port of a node published for a lease's container port. A node gives each port once."""

    node = models.ForeignKey("scheduler.Node", related_name="port_bindings", on_delete=models.CASCADE)
    host_port = models.PositiveIntegerField()
    run = models.ForeignKey(WorkloadRun, related_name="ports", on_delete=models.CASCADE)
    container_port = models.PositiveIntegerField()
    protocol = models.CharField(max_length=3, default="tcp")
    kind = models.CharField(max_length=8, default="tcp", help_text="ssh, http or tcp: how it is shown")

    class Meta:
        ordering = ["container_port"]
        constraints = [
            models.UniqueConstraint(fields=["node", "host_port"], name="port_once_per_node"),
            models.CheckConstraint(condition=Q(host_port__gte=1) & Q(host_port__lte=65535), name="port_in_range"),
        ]

    def __str__(self) -> str:
        return f"{self.host_port}->{self.container_port}/{self.protocol}"
