"""The TCO calculator (seed 000 §2.3): what a planned workload costs bought outright, on demand, reserved, on spot
and in a mix, line by line, and per GPU-hour of useful work. The calculation (`tco`) is pure, on Decimals; the
defaults (`tco_defaults`) come from the catalog (the model's TDP, the market's prices through pricing.price_for,
the unit's measured spot interruption rate) and the buyer's own last 30 days of leases.

Cost lines (docs/operations.md "TCO calculator"):
- buy: hardware = price per GPU × GPUs × min(1, months of the plan / depreciation months); power = W × GPUs ×
  hours used × PUE × $/kWh / 1000; hosting = $ per GPU-month × GPUs × months. Owned GPUs are paid for around the
  clock, so their useful share is hours per day / 24 × utilisation.
- on demand, reserved, spot = the mode's price per GPU-hour × GPUs × hours used (rented only while the work
  runs); spot adds rework: interruptions per hour × hours of work lost per interruption, paid again at the spot
  price.
- mix = reserved share × reserved + spot share × spot + the rest on demand.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_CEILING, Decimal

from django.db.models import Avg, Count, Min, Q
from django.utils import timezone

from marketplace.amounts import cents, micro
from marketplace.models import Interruption, Lease
from marketplace.pricing import price_for, spot_factor_for
from nodeagent.hardware.gpus import GPU_MODELS
from scheduler.core import perf
from scheduler.errors import DomainError
from scheduler.models import GpuMetricRollup, Node

DAYS_PER_MONTH = Decimal(30)  # the seed's month (its example is "30天")
HOURS_PER_DAY = Decimal(24)
# A list price per GPU for the buy side until the buyer enters its own quote (USD, rough street prices of 2025-26:
# a starting point, shown as an editable default).
HARDWARE_PRICES = {
    "a100-40gb": Decimal("10000"), "a100-80gb": Decimal("15000"), "h100-80gb": Decimal("28000"),
    "h100-nvl-94gb": Decimal("30000"), "h200-141gb": Decimal("32000"), "a30-24gb": Decimal("5000"),
    "l40s": Decimal("8000"), "l4": Decimal("2500"), "a10": Decimal("3000"), "rtx-4090": Decimal("1800"),
    "v100": Decimal("3000"), "t4": Decimal("1000"),
}
DEFAULTS = {"depreciation_months": 36, "pue": Decimal("1.4"), "usd_per_kwh": Decimal("0.12"),
            "hosting_per_gpu_month": Decimal("150"), "rework_hours": Decimal("0.5"), "utilisation": Decimal("0.65")}


@dataclass(frozen=True)
class Plan:
    gpus: int
    hours_per_day: Decimal
    days: int
    utilisation: Decimal  # expected share of the hours used that do useful work, 0..1

    @property
    def gpu_hours(self) -> Decimal:
        return self.gpus * self.hours_per_day * self.days

    @property
    def months(self) -> Decimal:
        return Decimal(self.days) / DAYS_PER_MONTH


@dataclass(frozen=True)
class Purchase:
    hardware_price_per_gpu: Decimal
    depreciation_months: int
    power_watts_per_gpu: Decimal
    pue: Decimal
    usd_per_kwh: Decimal
    hosting_per_gpu_month: Decimal


@dataclass(frozen=True)
class Rental:
    on_demand_per_gpu_hour: Decimal
    reserved_per_gpu_hour: Decimal
    spot_per_gpu_hour: Decimal
    spot_interruptions_per_hour: Decimal
    rework_hours_per_interruption: Decimal
    mix_reserved_share: Decimal = Decimal("0.5")
    mix_spot_share: Decimal = Decimal("0.25")


@dataclass(frozen=True)
class Option:
    name: str
    lines: dict[str, Decimal]  # cost line -> USD (cents)
    paid_gpu_hours: Decimal  # the GPU-hours paid for (owned: around the clock)
    useful_gpu_hours: Decimal

    @property
    def total(self) -> Decimal:
        return cents(sum(self.lines.values(), Decimal(0)))

    @property
    def effective_utilisation(self) -> Decimal:
        """The share of the GPU-hours paid for that did useful work."""
        return (self.useful_gpu_hours / self.paid_gpu_hours).quantize(Decimal("0.0001")) if self.paid_gpu_hours \
            else Decimal(0)

    @property
    def per_useful_gpu_hour(self) -> Decimal:
        return micro(self.total / self.useful_gpu_hours) if self.useful_gpu_hours else Decimal(0)


def _check(plan: Plan, purchase: Purchase, rental: Rental) -> None:
    if plan.gpus < 1 or plan.days < 1 or not Decimal(0) < plan.hours_per_day <= HOURS_PER_DAY:
        raise DomainError("a plan needs at least one GPU, one day and between 0 and 24 hours a day", code="invalid_plan")
    if not Decimal(0) < plan.utilisation <= 1:
        raise DomainError("utilisation is a share above 0 and at most 1 (0.65 for 65%)", code="invalid_plan")
    if purchase.depreciation_months < 1:
        raise DomainError("depreciation takes at least one month", code="invalid_plan")
    if rental.mix_reserved_share < 0 or rental.mix_spot_share < 0 or rental.mix_reserved_share + rental.mix_spot_share > 1:
        raise DomainError("the mix's reserved and spot shares are non-negative and add up to at most 1",
                          code="invalid_plan")


def buy_hardware(plan: Plan, p: Purchase) -> Decimal:
    """The part of the purchase the plan uses up: straight-line over the depreciation months, at most all of it."""
    share = min(Decimal(1), plan.months / Decimal(p.depreciation_months))
    return cents(p.hardware_price_per_gpu * plan.gpus * share)


def buy_power(plan: Plan, p: Purchase) -> Decimal:
    """W × hours used × PUE × $/kWh (the board's draw while working; the facility's overhead through PUE)."""
    return cents(p.power_watts_per_gpu * plan.gpu_hours * p.pue * p.usd_per_kwh / 1000)


def buy_hosting(plan: Plan, p: Purchase) -> Decimal:
    return cents(p.hosting_per_gpu_month * plan.gpus * plan.months)


def rented(price_per_gpu_hour: Decimal, plan: Plan) -> Decimal:
    return cents(price_per_gpu_hour * plan.gpu_hours)


def spot_rework(plan: Plan, r: Rental) -> Decimal:
    """Work lost to interruptions, done again at the spot price: rate × hours × hours lost per interruption."""
    return cents(r.spot_per_gpu_hour * plan.gpu_hours * r.spot_interruptions_per_hour
                 * r.rework_hours_per_interruption)


def tco(plan: Plan, purchase: Purchase, rental: Rental) -> list[Option]:
    """Each way to run the plan with its cost lines (USD to the cent), cheapest per useful GPU-hour is not sorted:
    buy, on_demand, reserved, spot, mix, in that order."""
    _check(plan, purchase, rental)
    useful = plan.gpu_hours * plan.utilisation
    owned_hours = plan.gpus * HOURS_PER_DAY * plan.days
    buy = Option("buy", {"hardware": buy_hardware(plan, purchase), "power": buy_power(plan, purchase),
                         "hosting": buy_hosting(plan, purchase)}, owned_hours, useful)
    on_demand = Option("on_demand", {"rent": rented(rental.on_demand_per_gpu_hour, plan)}, plan.gpu_hours, useful)
    reserved = Option("reserved", {"rent": rented(rental.reserved_per_gpu_hour, plan)}, plan.gpu_hours, useful)
    spot = Option("spot", {"rent": rented(rental.spot_per_gpu_hour, plan), "rework": spot_rework(plan, rental)},
                  plan.gpu_hours, useful)
    rest = 1 - rental.mix_reserved_share - rental.mix_spot_share
    mix = Option("mix", {"reserved": cents(reserved.total * rental.mix_reserved_share),
                         "spot": cents(spot.total * rental.mix_spot_share),
                         "on_demand": cents(on_demand.total * rest)}, plan.gpu_hours, useful)
    return [buy, on_demand, reserved, spot, mix]


# --- defaults: the catalog and the buyer's own leases ---------------------------------------------------------------

def _interruptions_per_hour(*, model: str, since: datetime, now: datetime) -> Decimal:
    """The model's measured spot interruption rate: interruptions over its spot lease-hours in the window."""
    count = Interruption.objects.filter(gpu_model=model, announced_at__gte=since).count()
    hours = Decimal(0)
    for started, ended in Lease.objects.filter(mode="spot", slice__gpu__gpu_model__key=model, started_at__isnull=False
                                               ).filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since)
                                                        ).values_list("started_at", "ended_at"):
        span = (min(ended or now, now) - max(started, since)).total_seconds()
        hours += Decimal(max(span, 0.0)) / 3600
    return (Decimal(count) / hours).quantize(Decimal("0.0001")) if hours > 0 else Decimal(0)


def _unit_base(model: str) -> Decimal:
    """The cheapest online provider's base price for a whole GPU of `model` (the default $2 without one)."""
    cheapest = (Node.objects.filter(status=Node.Status.ONLINE, gpus__gpu_model__key=model)
                .aggregate(p=Min("price_per_gpu_hour"))["p"])
    return Decimal(cheapest) if cheapest is not None else Decimal("2.00")


def _own_usage(*, buyer, since: datetime, now: datetime) -> dict:
    """The buyer's last 30 days of leases: the model used most, GPUs at a time, hours a day, measured utilisation."""
    rows = list(Lease.objects.filter(buyer=buyer, started_at__isnull=False)
                .filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since))
                .values_list("slice__gpu__gpu_model__key", "slice__gpu_id", "started_at", "ended_at"))
    if not rows:
        return {}
    hours_by_model: Counter = Counter()
    total = 0.0
    for model, _gpu, started, ended in rows:
        span = max((min(ended or now, now) - max(started, since)).total_seconds(), 0.0) / 3600
        hours_by_model[model] += span
        total += span
    if total <= 0:
        return {}
    days = max((now - since).days, 1)
    gpus = min(len({g for _m, g, _s, _e in rows}), 64)  # the GPUs it used; the hours a day spread over them
    util = (GpuMetricRollup.objects.filter(gpu_id__in={g for _m, g, _s, _e in rows}, minute__gte=since)
            .aggregate(u=Avg("util_avg"), n=Count("pk")))
    out = {"gpu_model": hours_by_model.most_common(1)[0][0], "gpus": gpus,
           "hours_per_day": max(Decimal("0.01"), min(Decimal(24), Decimal(str(round(total / days / gpus, 2)))))}
    if util["n"] and util["u"] is not None:
        out["utilisation"] = max(Decimal("0.01"), min(Decimal(1), Decimal(str(round(util["u"] / 100, 4)))))
    return out


def tco_defaults(*, buyer=None, gpu_model: str | None = None, now: datetime | None = None,
                 hardware_prices: dict | None = None) -> dict:
    """Every input of the calculator with its default: the model (the buyer's most used one, else `gpu_model`, else
    A100-80GB), its TDP, list price and market prices per whole GPU-hour, its measured spot interruption rate, and
    the buyer's own GPUs, hours a day and utilisation over the last 30 days (where it has leases)."""
    now = now or timezone.now()
    since = now - timedelta(days=30)
    usage = _own_usage(buyer=buyer, since=since, now=now) if buyer is not None else {}
    model = gpu_model or usage.get("gpu_model") or "a100-80gb"
    if model not in GPU_MODELS:
        raise DomainError(f"unknown GPU model {model!r}", code="unknown_model", field="gpu_model")
    spec = GPU_MODELS[model]
    base = _unit_base(model)
    prices = hardware_prices or HARDWARE_PRICES
    whole = {mode: price_for(mode=mode, base_per_gpu_hour=base, geometry=None, profile=None,
                             spot_factor=spot_factor_for(model=model) if mode == "spot" else None)
             for mode in ("on_demand", "reserved", "spot")}
    return {
        "gpu_model": model, "gpus": usage.get("gpus", 8), "hours_per_day": usage.get("hours_per_day", Decimal(24)),
        "days": 30, "utilisation": usage.get("utilisation", DEFAULTS["utilisation"]),
        "hardware_price_per_gpu": prices.get(model, Decimal("10000")),
        "depreciation_months": DEFAULTS["depreciation_months"], "power_watts_per_gpu": Decimal(spec.tdp_w),
        "pue": DEFAULTS["pue"], "usd_per_kwh": DEFAULTS["usd_per_kwh"],
        "hosting_per_gpu_month": DEFAULTS["hosting_per_gpu_month"],
        "on_demand_per_gpu_hour": whole["on_demand"], "reserved_per_gpu_hour": whole["reserved"],
        "spot_per_gpu_hour": whole["spot"],
        "spot_interruptions_per_hour": _interruptions_per_hour(model=model, since=since, now=now),
        "rework_hours_per_interruption": DEFAULTS["rework_hours"],
        "mix_reserved_share": Decimal("0.5"), "mix_spot_share": Decimal("0.25"),
        "from_your_leases": bool(usage), "pu_needed": None,
    }


def gpus_for_pu(*, gpu_model: str, pu_needed) -> int:
    """How many whole GPUs of `gpu_model` deliver `pu_needed` performance units (docs/performance-units.md)."""
    per_gpu = Decimal(str(perf.gpu_pu(GPU_MODELS[gpu_model])))
    return max(1, int((Decimal(pu_needed) / per_gpu).to_integral_value(rounding=ROUND_CEILING)))


def tco_for(values: dict) -> tuple[Plan, list[Option]]:
    """The calculation on a full set of inputs (tco_defaults' keys); a `pu_needed` sets the GPUs (gpus_for_pu)."""
    if values.get("pu_needed"):
        values["gpus"] = gpus_for_pu(gpu_model=values["gpu_model"], pu_needed=values["pu_needed"])
    plan = Plan(gpus=int(values["gpus"]), hours_per_day=Decimal(values["hours_per_day"]), days=int(values["days"]),
                utilisation=Decimal(values["utilisation"]))
    purchase = Purchase(**{k: values[k] for k in ("hardware_price_per_gpu", "depreciation_months",
                                                   "power_watts_per_gpu", "pue", "usd_per_kwh",
                                                   "hosting_per_gpu_month")})
    rental = Rental(**{k: values[k] for k in ("on_demand_per_gpu_hour", "reserved_per_gpu_hour",
                                               "spot_per_gpu_hour", "spot_interruptions_per_hour",
                                               "mix_reserved_share", "mix_spot_share")},
                    rework_hours_per_interruption=values["rework_hours_per_interruption"])
    return plan, tco(plan, purchase, rental)
