"""The reliability score you can take apart: one number per node and per GPU made of named components, each
computed from recorded events, each with its weight, so a buyer or provider reads why a node scores what it does.

score = Σ weight_i × component_i / Σ weight_i, every component in 0..1 (1 = nothing went wrong):

- uptime: share of the window the node was online (heartbeats; offline/online transitions);
- provisioning: share of slice create/destroy commands that succeeded (none yet: 1);
- health: 1 / (1 + Σ penalty of each health event): thermal, power, ECC and XID by code, each its own penalty
  (an XID a buyer's program causes, 13 or 31, costs nothing; 79 "fallen off the bus" costs most);
- interruptions: 1 − leases the node took down (spot interruptions it caused, leases lost when it went offline or
  failed to provision) / leases it hosted;
- buyer_reports: 1 − leases its buyers reported as failed / leases it hosted.

Weights and penalties are data (settings.RELIABILITY, defaults below). Pure: plain dataclasses in and out.
"""
from __future__ import annotations

from dataclasses import dataclass, field

COMPONENTS = ("uptime", "provisioning", "health", "interruptions", "buyer_reports")

DEFAULT_WEIGHTS: dict[str, float] = {"uptime": 0.30, "provisioning": 0.15, "health": 0.25, "interruptions": 0.15,
                                     "buyer_reports": 0.15}
# Health-event penalties; "xid:<code>" overrides "xid" for that code. XIDs 13, 31 and 43 are raised by the
# buyer's own program (NVIDIA's XID catalogue: graphics engine exception, MMU fault, channel reset) and say
# nothing about the GPU; 48 (double-bit ECC), 79 (fallen off the bus), 92/94/95 (ECC and containment) do.
DEFAULT_PENALTIES: dict[str, float] = {
    "thermal": 0.05, "power": 0.05, "ecc": 0.20, "xid": 0.10,
    "xid:13": 0.0, "xid:31": 0.0, "xid:43": 0.0, "xid:48": 0.30, "xid:63": 0.05, "xid:64": 0.15,
    "xid:74": 0.30, "xid:79": 0.50, "xid:92": 0.10, "xid:94": 0.20, "xid:95": 0.30,
}


@dataclass(frozen=True)
class Config:
    weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    penalties: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_PENALTIES))

    def __post_init__(self):
        unknown = set(self.weights) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"unknown reliability components: {', '.join(sorted(unknown))}")
        if any(w < 0 for w in self.weights.values()) or sum(self.weights.values()) <= 0:
            raise ValueError("reliability weights must be non-negative and not all zero")
        if any(p < 0 for p in self.penalties.values()):
            raise ValueError("health penalties must be non-negative")

    def penalty(self, event: str) -> float:
        """The penalty of one health event ("thermal", "ecc", "xid:79", ...)."""
        if event in self.penalties:
            return self.penalties[event]
        return self.penalties.get(event.split(":", 1)[0], 0.0)


@dataclass
class Evidence:
    """What was recorded for a node or a GPU over the window."""

    window_seconds: float = 0.0
    online_seconds: float = 0.0
    commands_succeeded: int = 0
    commands_failed: int = 0
    health: dict[str, int] = field(default_factory=dict)  # "thermal" | "power" | "ecc" | "xid:<code>" -> count
    leases_hosted: int = 0
    interruptions_caused: int = 0
    buyer_reports: int = 0

    def add(self, other: "Evidence") -> None:
        """Fold a GPU's lease and health evidence into its node's (uptime stays the node's own)."""
        self.commands_succeeded += other.commands_succeeded
        self.commands_failed += other.commands_failed
        for k, n in other.health.items():
            self.health[k] = self.health.get(k, 0) + n
        self.leases_hosted += other.leases_hosted
        self.interruptions_caused += other.interruptions_caused
        self.buyer_reports += other.buyer_reports


@dataclass(frozen=True)
class Component:
    name: str
    value: float  # 0..1
    weight: float  # its share of the score (weights normalised to sum 1)
    events: dict  # the counts behind it

    @property
    def contribution(self) -> float:
        return self.value * self.weight


@dataclass(frozen=True)
class Score:
    score: float
    components: tuple[Component, ...]

    @property
    def formula(self) -> str:
        """The sum as a user reads it: 0.30 × 0.990 (uptime) + ... = 0.962."""
        terms = " + ".join(f"{c.weight:.2f} × {c.value:.3f} ({c.name})" for c in self.components)
        return f"{terms} = {self.score:.3f}"

    def to_dict(self) -> dict:
        return {"score": self.score, "formula": self.formula,
                "components": [{"name": c.name, "value": round(c.value, 4), "weight": round(c.weight, 4),
                                "contribution": round(c.contribution, 4), "events": c.events}
                               for c in self.components]}


def _share(good: float, total: float) -> float:
    return 1.0 if total <= 0 else max(0.0, min(1.0, good / total))


def score(evidence: Evidence, config: Config | None = None) -> Score:
    """The score of `evidence` with its components (values 0..1, weights summing to 1)."""
    config = config or Config()
    e = evidence
    penalty = sum(config.penalty(kind) * n for kind, n in e.health.items())
    values = {
        "uptime": (_share(e.online_seconds, e.window_seconds),
                   {"online_seconds": round(e.online_seconds), "window_seconds": round(e.window_seconds)}),
        "provisioning": (_share(e.commands_succeeded, e.commands_succeeded + e.commands_failed),
                         {"succeeded": e.commands_succeeded, "failed": e.commands_failed}),
        "health": (1.0 / (1.0 + penalty), {**dict(sorted(e.health.items())), "penalty": round(penalty, 4)}),
        "interruptions": (_share(e.leases_hosted - e.interruptions_caused, e.leases_hosted),
                          {"caused": e.interruptions_caused, "leases_hosted": e.leases_hosted}),
        "buyer_reports": (_share(e.leases_hosted - e.buyer_reports, e.leases_hosted),
                          {"reported_failed": e.buyer_reports, "leases_hosted": e.leases_hosted}),
    }
    total = sum(config.weights.get(name, 0.0) for name in COMPONENTS)
    components = tuple(Component(name, values[name][0], config.weights.get(name, 0.0) / total, values[name][1])
                       for name in COMPONENTS)
    return Score(min(1.0, round(sum(c.contribution for c in components), 4)), components)
