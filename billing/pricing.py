"""Money arithmetic and the spot price formula. Pure: no Django, `Decimal` and `int` only.

Rules (docs/billing.md repeats them):

1. Money is `Decimal`, never float. Prices are per hour of an instance with 4 places
   (`Price.per_hour`). The ledger keeps micro-units (6 places, `MICRO`); invoices and
   what people read are in cents (2 places, `CENT`).
2. Usage is first kept exact as *price-seconds*: `seconds × nodes × per_hour`. That is a
   `Decimal` with 4 places and no rounding at all (integers times a 4-place price).
3. Rounding happens once per line, half up (`ROUND_HALF_UP`, the commercial rule):
   a ledger entry is `micro(cumulative after) − micro(cumulative before)` of its
   workload's price-seconds, so the entries of a workload always add up to the exact
   total rounded once, however the metering windows were cut; an invoice line is
   `cent(Σ price-seconds / 3600)` over its usage.
4. Spot prices: see `spot_price`.
"""
from __future__ import annotations

from decimal import ROUND_FLOOR, ROUND_HALF_UP, Decimal

CENT = Decimal("0.01")
MICRO = Decimal("0.000001")
PRICE_PLACES = Decimal("0.0001")  # Price.per_hour
SECONDS_PER_HOUR = 3600

# Spot prices move in steps of this much GPU allocation, so they change when demand
# really moves, not at every placement (and the price history stays readable).
SPOT_UTILISATION_STEP = Decimal("0.05")


def micro_of_price_seconds(price_seconds: Decimal) -> Decimal:
    """`price_seconds / 3600` rounded half up to micro-units, computed exactly in integers.

    `price_seconds` has at most 4 places (see rule 2), so ×10⁴ is an integer n and the
    amount in micro-units is n × 10⁶ / (3600 × 10⁴) = n / 36: integer arithmetic, no
    intermediate rounding by the decimal context.
    """
    n = int(price_seconds.scaleb(4).to_integral_value())
    if Decimal(n) != price_seconds.scaleb(4):
        raise ValueError(f"price-seconds with more than 4 places: {price_seconds}")
    sign = -1 if n < 0 else 1
    micros = (2 * abs(n) + 36) // 72  # half up: floor(n/36 + 1/2)
    return (Decimal(sign * micros) * MICRO).quantize(MICRO)


def cents_of_price_seconds(price_seconds: Decimal) -> Decimal:
    """`price_seconds / 3600` rounded half up to cents: an invoice line's amount."""
    n = int(price_seconds.scaleb(4).to_integral_value())
    sign = -1 if n < 0 else 1
    # cents = n / 10⁴ / 3600 × 100 = n / 360000
    cents = (2 * abs(n) + 360000) // 720000
    return (Decimal(sign * cents) * CENT).quantize(CENT)


def cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


def per_gpu_hour(*, per_hour: Decimal, gpu_milli: int) -> Decimal:
    """An instance's hourly price per whole GPU it holds (gpu_milli = GPUs × 1000).

    For the catalogue's shapes (1, 2, 4, 8 GPUs; ⅛, ¼, ½ of one) the division is exact;
    six places keep any other shape readable.
    """
    return (per_hour * 1000 / gpu_milli).quantize(MICRO, rounding=ROUND_HALF_UP)


def gpu_hours(*, gpu_milli_seconds: int) -> Decimal:
    """GPU-milli-seconds (seconds × milli-GPUs held) → GPU-hours, 4 places, half up."""
    return (Decimal(gpu_milli_seconds) / (1000 * SECONDS_PER_HOUR)).quantize(PRICE_PLACES, rounding=ROUND_HALF_UP)


def spot_price(*, on_demand: Decimal, floor_fraction: Decimal, allocated_milli: int, total_milli: int) -> Decimal:
    """The spot price of an instance type in a region, from demand for its GPU model there.

        u     = allocated / total GPU capacity of that model in the region (0 when there is none),
                rounded down to a step of 5 %
        floor = on_demand × floor_fraction              (the operator's floor, default 30 %)
        spot  = floor + (on_demand − floor) × u²        rounded half up to 4 places

    Quadratic: spot stays cheap while there is slack and climbs steeply as the region
    fills, reaching the on-demand price when every GPU of the model is taken. The
    result always lies in [floor, on_demand].
    """
    if total_milli <= 0:
        u = Decimal(0)
    else:
        u = Decimal(min(max(allocated_milli, 0), total_milli)) / Decimal(total_milli)
    u = (u / SPOT_UTILISATION_STEP).to_integral_value(rounding=ROUND_FLOOR) * SPOT_UTILISATION_STEP
    frac = min(max(floor_fraction, Decimal(0)), Decimal(1))
    floor = on_demand * frac
    price = floor + (on_demand - floor) * u * u
    price = price.quantize(PRICE_PLACES, rounding=ROUND_HALF_UP)
    return min(max(price, floor.quantize(PRICE_PLACES, rounding=ROUND_HALF_UP)), on_demand)
