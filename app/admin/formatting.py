"""How the dashboard writes numbers and times (one place, used by pages, chart and CSV)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any


def epsilon(value: float) -> str:
    """The float's shortest exact text, as the API's JSON has it (``1.0`` reads ``1``)."""
    text = repr(float(value))
    if text == "-0.0":
        return "0"
    return text[:-2] if text.endswith(".0") else text


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


def mechanisms(by_mechanism: Mapping[str, Any]) -> str:
    return " · ".join(f"{name} {epsilon(float(eps))}" for name, eps in by_mechanism.items())


def details(values: Mapping[str, Any]) -> str:
    return json.dumps(values, ensure_ascii=False, sort_keys=True, separators=(", ", ": "))
