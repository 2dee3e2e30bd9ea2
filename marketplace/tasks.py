"""Celery tasks of the market; each is a thin call of a service, guarded by state so a redelivery is harmless."""
from celery import shared_task

from marketplace.services import leases, metering, notify, orders, spot


@shared_task(name="market.meter")
def meter() -> int:
    return metering.meter_tick()


@shared_task(name="market.retry_queue")
def retry_queue() -> int:
    return orders.orders_retry()


@shared_task(name="market.spot_prices")
def spot_prices() -> int:
    return spot.spot_prices_recompute()


@shared_task(name="market.lease_tick")
def lease_tick() -> int:
    return leases.leases_tick()


@shared_task(name="market.deliver_webhook", ignore_result=True)
def deliver_webhook(url: str, payload: dict) -> bool:
    return notify.webhook_post(url=url, payload=payload)
