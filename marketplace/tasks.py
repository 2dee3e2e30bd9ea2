"""Celery tasks of the market; each is a thin call of a service, guarded by state so a redelivery is harmless.
Below this layer tasks are queued by name (events.run_task), never imported."""
from celery import shared_task

from marketplace import events
from marketplace.lifecycle import leases
from marketplace.money import check
from marketplace.operations import autoscale, reclaim
from marketplace.products import alerts, orders, payments, payouts, reservations, spot


@shared_task(name="market.meter")
def meter() -> int:
    posted = leases.meter_tick()
    # After the postings: wallets now under their auto top-up threshold are topped up, each in its own task.
    for user_id in payments.auto_topups_due():
        auto_topup.delay(user_id)
    return posted


@shared_task(name="market.auto_topup", ignore_result=True)
def auto_topup(user_id: int) -> None:
    payments.auto_topup_run(user_id=user_id)  # guarded: one charge in flight per user


@shared_task(name="market.retry_queue")
def retry_queue() -> int:
    return orders.orders_retry()


@shared_task(name="market.spot_prices")
def spot_prices() -> int:
    return spot.spot_prices_recompute()


@shared_task(name="market.lease_tick")
def lease_tick() -> int:
    return leases.leases_tick()


@shared_task(name="market.reservations_tick")
def reservations_tick() -> None:
    reservations.reservations_tick()


@shared_task(name="market.reclaim")
def reclaim_idle() -> int:
    return reclaim.reclaim_tick()


@shared_task(name="market.autoscale")
def autoscale_groups() -> int:
    return autoscale.autoscale_tick()


@shared_task(name=events.DELIVER_WEBHOOK, ignore_result=True)
def deliver_webhook(url: str, payload: dict) -> bool:
    return events.webhook_post(url=url, payload=payload)


@shared_task(name="money.ledger_check")
def ledger_check() -> bool:
    return check.ledger_check_run().ok


@shared_task(name="money.payouts_resend")
def payouts_resend() -> int:
    return payouts.payouts_resend()


@shared_task(name="market.alerts_evaluate")
def alerts_evaluate() -> dict:
    return alerts.alerts_evaluate()
