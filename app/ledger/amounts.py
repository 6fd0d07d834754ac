"""Exact privacy amounts: ε and δ as decimals of a fixed number of places.

Budgets, caps and charges are stored as integers of a fixed unit (10⁻¹² for ε, 10⁻¹⁸ for
δ: see :class:`app.models.FixedPoint`), so that sums are exact and no small spend is ever
lost to floating point. A number from a request (a float) becomes an amount through its
shortest ``repr`` (``0.1`` is one tenth, not the nearest binary fraction), rounded to the
unit in the safe direction: a cap or a budget rounds down (never more than was granted),
a charge rounds up (never less than was spent).

>>> epsilon(0.1)
Decimal('0.100000000000')
>>> epsilon(1 / 3), epsilon(1 / 3, charge=True)
(Decimal('0.333333333333'), Decimal('0.333333333334'))
>>> delta(1e-6)
Decimal('0.000001000000000000')
>>> shown(epsilon(0.3))
0.3
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

EPSILON_PLACES = 12
DELTA_PLACES = 18
_EPSILON_UNIT = Decimal(1).scaleb(-EPSILON_PLACES)
_DELTA_UNIT = Decimal(1).scaleb(-DELTA_PLACES)


def exact(value: float | int | str | Decimal) -> Decimal:
    """The decimal a number reads as: a float through its shortest ``repr``."""
    if isinstance(value, bool):
        raise TypeError("a privacy amount is a number, not a boolean")
    if isinstance(value, float):
        return Decimal(repr(value))
    return Decimal(value)


def _quantized(value: float | int | str | Decimal, unit: Decimal, charge: bool) -> Decimal:
    amount = exact(value)
    if not amount.is_finite() or amount < 0:
        raise ValueError("a privacy amount is finite and not negative")
    return amount.quantize(unit, rounding=ROUND_CEILING if charge else ROUND_FLOOR)


def epsilon(value: float | int | str | Decimal, *, charge: bool = False) -> Decimal:
    """ε to the stored unit: rounded up for a charge, down for a cap or a budget."""
    return _quantized(value, _EPSILON_UNIT, charge)


def delta(value: float | int | str | Decimal, *, charge: bool = False) -> Decimal:
    """δ to the stored unit: rounded up for a charge, down for a cap or a budget."""
    return _quantized(value, _DELTA_UNIT, charge)


def shown(amount: Decimal) -> float:
    """An amount as a JSON number (display only: every comparison uses the decimals)."""
    return float(amount)
