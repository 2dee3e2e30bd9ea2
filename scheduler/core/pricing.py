"""The one price rule (DESIGN §5), pure: what a slice costs per hour in each way of buying it.

base = the provider's committed price for one whole GPU-hour; a slice costs base × its share of the GPU ×
the factor of the way it is bought. The share of a MIG profile is the larger of its compute share and its
memory share, because either one is capacity nobody else can use (a 3g.40gb holds 3/7 of compute but 4/8
of memory: it costs 1/2). The factors (`PriceRules`) are configuration: the market reads them from its
settings, the simulator uses the defaults, and both call these functions, so the engine's price filter and
scorer see the same price the buyer is charged.

Factors, all on base (the seed's 市场价 read as the unit's base price): on demand 1.8; reserved 0.85 booked
at least an hour ahead, else 1.0; spot 0.5..0.7 moving with the free share of that model's pool (always the
cheapest way in, below reserved); a resale ask at most 0.9.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from nodeagent.hardware.mig import MigGeometry

MICRO = Decimal("0.000001")
FACTOR = Decimal("0.0001")  # spot factors are kept to four places (the price history stores them)
MODES = ("on_demand", "reserved", "reserved_short_notice", "spot")


@dataclass(frozen=True)
class PriceRules:
    """Factors on base × share for each way of buying (DESIGN §5 defaults)."""

    on_demand: Decimal = Decimal("1.8")
    reserved: Decimal = Decimal("0.85")  # booked at least `reserved_ahead_seconds` before the window
    reserved_short_notice: Decimal = Decimal("1.0")
    spot_min: Decimal = Decimal("0.5")  # spot when the model's pool is all free
    spot_max: Decimal = Decimal("0.7")  # spot when it is full
    resale_cap: Decimal = Decimal("0.9")  # the highest resale ask

    def __post_init__(self) -> None:
        for name in ("on_demand", "reserved", "reserved_short_notice", "spot_min", "spot_max", "resale_cap"):
            value = getattr(self, name)
            if not isinstance(value, Decimal) or not value.is_finite() or value < 0:
                raise ValueError(f"price factor {name} must be a Decimal >= 0, not {value!r}")
        if self.spot_min > self.spot_max:
            raise ValueError("spot_min is above spot_max")

    def spot_factor(self, *, free_share: float) -> Decimal:
        """The spot factor on base: `spot_min` when the pool is all free, `spot_max` when it is full."""
        free = Decimal(repr(min(1.0, max(0.0, float(free_share)))))
        return (self.spot_min + (self.spot_max - self.spot_min) * (1 - free)).quantize(FACTOR, ROUND_HALF_UP)

    def factor(self, mode: str, *, spot_factor: Decimal | None = None, free_share: float = 1.0) -> Decimal:
        """The factor on base × share for `mode`; spot takes the recorded `spot_factor`, else the free share's."""
        if mode == "spot":
            return spot_factor if spot_factor is not None else self.spot_factor(free_share=free_share)
        if mode not in MODES:
            raise ValueError(f"unknown price class {mode!r}; one of {', '.join(MODES)}")
        return getattr(self, mode)


DEFAULT_RULES = PriceRules()


def slice_share(*, geometry: MigGeometry | None, profile: str | None) -> float:
    """Share of one GPU a slice takes (1.0 for a whole GPU)."""
    if geometry is None or profile is None:
        return 1.0
    p = geometry.profile(profile)
    return max(p.compute_slices / geometry.compute_slices, p.memory_slices / geometry.memory_slices)


def share_decimal(*, geometry: MigGeometry | None, profile: str | None) -> Decimal:
    """`slice_share` as the Decimal money is computed with (the float's shortest repr, as the engine uses)."""
    return Decimal(repr(slice_share(geometry=geometry, profile=profile)))


def unit_price(*, base_per_gpu_hour: Decimal, share: Decimal, mode: str, rules: PriceRules = DEFAULT_RULES,
               spot_factor: Decimal | None = None, free_share: float = 1.0) -> Decimal:
    """What the buyer pays per hour for a slice of `share` in `mode`: exact, rounded half-up to the micro-dollar.
    The money side calls this; the engine calls `slice_price`, the same rule in floats."""
    factor = rules.factor(mode, spot_factor=spot_factor, free_share=free_share)
    return (Decimal(base_per_gpu_hour) * share * factor).quantize(MICRO, ROUND_HALF_UP)


def slice_price(*, base_per_gpu_hour: float, share: float, mode: str, rules: PriceRules = DEFAULT_RULES,
                spot_factor: Decimal | None = None, free_share: float = 1.0) -> float:
    """`unit_price` in floats for the engine's filters and scorers (comparisons and scores, never money)."""
    return base_per_gpu_hour * share * float(rules.factor(mode, spot_factor=spot_factor, free_share=free_share))
