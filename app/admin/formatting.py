"""How the dashboard writes numbers, times and words (one place, used by pages, chart and
CSV).

A privacy figure reads to 3 significant figures (:func:`figure`, ``0.999999418`` → ``1.00``)
inside an element whose ``title`` and ``data-exact`` hold the exact value as the API's JSON
has it (:func:`epsilon`); the JSON and the CSV keep the exact values. A figure already exact
at 3 significant figures keeps no padding zeros (``5``, ``0.5``), so ``1.00`` always says
"rounded".

"Release" has three meanings; a page uses one word for each (:data:`ENTRY_KINDS`,
:data:`BUDGET_STATES`, :data:`AUDIT_KINDS`): a *noisy release* (or *measurement*) is a DP
mechanism's output, a corpus is *released to a client* when it is granted, and a
*reservation freed* is a job's budget given back before any private read. Database values
and API fields keep their names; only the text on the pages changes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from markupsafe import Markup

from workers.privacy.accountant import EXACT_SUM, PLD_NAME

SIGNIFICANT = 3
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def epsilon(value: float) -> str:
    """The float's shortest exact text, as the API's JSON has it (``1.0`` reads ``1``)."""
    text = repr(float(value))
    if text == "-0.0":
        return "0"
    return text[:-2] if text.endswith(".0") else text


def significant(value: float | Decimal | None, digits: int = SIGNIFICANT) -> str:
    """``value`` to ``digits`` significant figures, for people: plain from 0.001 to below a
    million, else as ``m × 10ⁿ``; padding zeros only where the value was rounded.

    >>> significant(0.999999418), significant(1e-6), significant(5.0), significant(1 / 3)
    ('1.00', '1 × 10⁻⁶', '5', '0.333')
    """
    if value is None:
        return "—"
    number = float(value)
    if math.isnan(number):
        return "—"
    if math.isinf(number):
        return "∞" if number > 0 else "−∞"
    if number == 0:
        return "0"
    exact = Decimal(repr(number))
    exponent = math.floor(math.log10(abs(number)))
    rounded = exact.quantize(Decimal(1).scaleb(exponent - digits + 1), rounding=ROUND_HALF_EVEN)
    if rounded != 0 and math.floor(math.log10(abs(rounded))) != exponent:  # 9.995 → 10.0
        exponent += 1
        rounded = exact.quantize(Decimal(1).scaleb(exponent - digits + 1), rounding=ROUND_HALF_EVEN)
    padded = rounded != exact
    if -3 <= exponent < 6:
        places = max(digits - 1 - exponent, 0)
        text = f"{rounded:.{places}f}"
        if not padded and "." in text:
            text = text.rstrip("0").rstrip(".")
        return text
    mantissa = rounded.scaleb(-exponent)
    text = f"{mantissa:.{digits - 1}f}"
    if not padded:
        text = text.rstrip("0").rstrip(".")
    return f"{text} × 10{str(exponent).translate(_SUPERSCRIPT)}"


def exact_text(value: float | Decimal | None) -> str:
    """The exact value as the API's JSON writes it (``∞`` where the JSON has null)."""
    if value is None:
        return ""
    number = float(value)
    if math.isinf(number):
        return "∞"
    return epsilon(number)


def figure(value: float | Decimal | None, field: str | None = None) -> Markup:
    """The ``fig`` filter: 3 significant figures, the exact value on hover (``title``) and
    for scripts and tests (``data-exact``); ``field`` names it (``data-field``)."""
    exact = exact_text(value)
    named = Markup(' data-field="{}"').format(field) if field else ""
    return Markup('<span class="fig"{} title="{}" data-exact="{}">{}</span>').format(
        named, exact, exact, significant(value)
    )


def percent(share: float) -> str:
    value = share * 100
    return f"{value:.1f} %" if abs(value) < 10 else f"{value:.0f} %"


def when(moment: datetime | None) -> str:
    if moment is None:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def seconds(value: float | None) -> str:
    """A time estimate in words a person reads at a glance: ``about 3 min``."""
    if value is None:
        return ""
    if value < 60:
        return f"about {max(1, round(value))} s"
    if value < 3600:
        return f"about {round(value / 60)} min"
    return f"about {value / 3600:.1f} h"


def iso(moment: datetime | None) -> str:
    return moment.astimezone(UTC).isoformat() if moment is not None else ""


def mechanisms(by_mechanism: Mapping[str, Any]) -> Markup:
    return Markup(" · ").join(
        Markup("{} {}").format(name, figure(float(eps))) for name, eps in by_mechanism.items()
    )


def details(values: Mapping[str, Any]) -> str:
    return json.dumps(values, ensure_ascii=False, sort_keys=True, separators=(", ", ": "))


# -- words ------------------------------------------------------------------------------

# Ledger entry kinds (``ledger_entries.kind``) as pages say them.
ENTRY_KINDS = {"reserve": "reserve", "commit": "commit (spent)", "release": "reservation freed"}
# Where a job's ε stands (``ledger.budget_state``) as pages say it.
BUDGET_STATES = {"reserved": "reserved", "committed": "spent", "released": "reservation freed"}
# Audit event kinds whose names say "release": what they mean, in words.
AUDIT_KINDS = {
    "release.created": "corpus released to clients",
    "release.downloaded": "released corpus downloaded by a client",
}


def entry_kind(kind: str) -> str:
    return ENTRY_KINDS.get(kind, kind)


def budget_state(state: str) -> str:
    return BUDGET_STATES.get(state, state)


def audit_kind(kind: str) -> str:
    """An audit event kind with its meaning where its name alone is ambiguous."""
    meaning = AUDIT_KINDS.get(kind)
    return f"{kind} ({meaning})" if meaning else kind


# -- accountants ------------------------------------------------------------------------


def accountant(name: str) -> str:
    """What an accountant named by the ledger (:mod:`workers.privacy.accountant`) does, in
    plain words."""
    if name == EXACT_SUM:
        return (
            f"{name}: every noisy release is pure ε-DP, so ε composes as the exact sum "
            "(per-class measurements of one mechanism in parallel: their worst class)"
        )
    if name.startswith("pld("):
        return (
            f"{name}: Gaussian noise is in, so ε at the cap's δ comes from Google's "
            "dp-accounting privacy-loss distributions (tighter than a sum; per-class "
            "measurements of one mechanism in parallel)"
        )
    return name


def accountants(names: Iterable[str]) -> list[str]:
    """The distinct accountants behind a page's figures, in a stable order; the ledger's
    two regimes when the page shows no figure."""
    found = sorted(set(names))
    return found or [EXACT_SUM, PLD_NAME]
