"""Host ports: a lease's container ports are published on host ports from its node's range, each port of a node
given once (the node's row lock orders two claims; a unique constraint stands behind it)."""
from __future__ import annotations

from marketplace.models import PortBinding, WorkloadRun
from scheduler.errors import Conflict
from scheduler.models import Node


def ports_claim(*, run: WorkloadRun, node_id, wanted: list[dict]) -> list[PortBinding]:
    """Bind each wanted container port ({port, protocol, kind}) to the lowest free host port of the node's range.
    Conflict when the range is full. Call inside a transaction."""
    if not wanted:
        return []
    # Lock the node row: the race is two leases on this node taking the same free port.
    node = Node.objects.select_for_update().get(pk=node_id)
    taken = set(PortBinding.objects.filter(node=node).values_list("host_port", flat=True))
    free = (p for p in range(node.port_range_start, node.port_range_end + 1) if p not in taken)
    bindings = []
    for want in wanted:
        host = next(free, None)
        if host is None:
            raise Conflict(f"node {node.name} has no free host port left in {node.port_range_start}-"
                           f"{node.port_range_end}", code="no_free_port")
        bindings.append(PortBinding(node=node, host_port=host, run=run, container_port=int(want["port"]),
                                    protocol=want.get("protocol", "tcp"), kind=want.get("kind", "tcp")))
    return PortBinding.objects.bulk_create(bindings)


def ports_release(*, run: WorkloadRun) -> int:
    """The run's host ports go back to its node."""
    return PortBinding.objects.filter(run=run).delete()[0]
