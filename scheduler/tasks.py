"""Celery beat tasks of the fleet; each is a thin call of a service and safe to run twice."""
from celery import shared_task

from scheduler.services import commands as command_services
from scheduler.services import nodes as node_services
from scheduler.services import reliability as reliability_services


@shared_task(name="fleet.mark_silent_nodes_offline")
def mark_silent_nodes_offline() -> int:
    marked = node_services.nodes_mark_offline()
    node_services.nodes_lose_leases()
    return len(marked)


@shared_task(name="fleet.expire_commands")
def expire_commands() -> int:
    return command_services.commands_expire()


@shared_task(name="fleet.reliability")
def reliability() -> int:
    return reliability_services.reliability_recompute()


@shared_task(name="fleet.reliability_node")
def reliability_node(node_id: str) -> int:
    return reliability_services.reliability_recompute(node_ids=[node_id])
