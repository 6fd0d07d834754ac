"""What the API's bodies share: the configuration that gives a body its examples, and the
example values that stand in more than one body (one example world: the same dataset,
job and key wherever a body shows them)."""

from __future__ import annotations

from typing import Any, Unpack

from pydantic import ConfigDict


def with_examples(*examples: dict[str, Any], **config: Unpack[ConfigDict]) -> ConfigDict:
    """A model's configuration with ``examples`` in its JSON schema: every request and
    response body has one (tests/service/test_openapi_docs.py)."""
    return ConfigDict(**config, json_schema_extra={"examples": list(examples)})


# The example dataset's budget (a DatasetOut's and a ledger's).
BUDGET_EXAMPLE: dict[str, Any] = {
    "epsilon_cap": 5.0,
    "delta_cap": 1e-05,
    "spent": 0.0,
    "reserved": 0.872469478,
    "remaining": 4.127530522,
    "accountant": "pld(dp-accounting 0.6.0)",
}


def _kde_event(partition: str) -> dict[str, Any]:
    return {
        "mechanism": "kde",
        "name": None,
        "noise": "gaussian",
        "scale": 4.224681681995382,
        "sensitivity": 1.0,
        "norm": "l2",
        "dimension": 384,
        "partition": partition,
        "count": 1,
        "epsilon": None,
    }


# The example job's noisy releases: one DP-KDE release per class (a plan's and a ledger
# entry's).
KDE_EVENTS_EXAMPLE = [_kde_event("cardio"), _kde_event("ortho")]
