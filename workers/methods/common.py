"""What every generation method's run shares, written once.

* :class:`MethodResult`: what a run releases (records, the events of its releases, a
  public manifest, its LLM costs);
* :func:`check_label_set`, :func:`check_units`: the input checks made before any
  private read (errors name rows, never ids or text);
* :func:`checkpoint_json`, :func:`claim_checkpoints`, :func:`save_costs`,
  :func:`load_costs`: how a run writes its checkpoints and refuses another run's;
* :func:`complete_texts`: one completion per public request through the shared client.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workers.errors import ConfigError, InputDataError
from workers.llm.client import LLMCosts, LLMEndpoint, Messages, complete, run_sync
from workers.methods.checkpoints import Checkpoints
from workers.privacy.events import PrivacyEvent


@dataclass
class MethodResult:
    """What a run releases: records, the events of its releases, a public manifest."""

    records: list[tuple[str, str]]  # (label, text)
    events: list[PrivacyEvent]
    manifest: dict[str, Any]
    llm_costs: LLMCosts


def check_label_set(label_set: Sequence[str]) -> tuple[str, ...]:
    """The declared labels: non-empty strings, none repeated."""
    labels = tuple(label_set)
    if not labels:
        raise ConfigError("the label set is empty", field="labels")
    if any(not isinstance(label, str) or not label for label in labels):
        raise ConfigError("labels must be non-empty strings", field="labels")
    if len(set(labels)) != len(labels):
        raise ConfigError("the label set repeats a label", field="labels")
    return labels


def check_units(units: Sequence[str], documents: int) -> None:
    """A unit id per document, each a non-empty string; errors name rows, never ids."""
    if isinstance(units, str) or len(units) != documents:
        raise InputDataError("give one unit per document", field="units")
    bad = [i + 1 for i, u in enumerate(units) if not isinstance(u, str) or not u]
    if bad:
        rows = ", ".join(map(str, bad[:10])) + (" …" if len(bad) > 10 else "")
        raise InputDataError(f"empty or non-string unit (rows {rows})", field="units")


def checkpoint_json(data: Any) -> bytes:
    """A checkpoint's bytes: strict JSON (no NaN), UTF-8."""
    return json.dumps(data, ensure_ascii=False, allow_nan=False).encode()


def no_progress(stage: str, fraction: float) -> None:
    return None


def complete_texts(
    requests: Sequence[Messages], *, endpoint: LLMEndpoint, concurrency: int, costs: LLMCosts
) -> list[str | None]:
    """One completion per request; ``None`` where the endpoint failed."""
    if not requests:
        return []
    outcomes = run_sync(
        complete(
            requests.__getitem__,
            len(requests),
            endpoint=endpoint,
            concurrency=concurrency,
            costs=costs,
        )
    )
    return [o.text for o in outcomes]


def claim_checkpoints(checkpoints: Checkpoints, key: str, identity: dict[str, Any]) -> None:
    """Tie ``checkpoints`` to a run's public configuration (``identity``, with its
    ``method``): the first run writes its fingerprint, a run of another configuration is
    refused (its saved DP outputs are not this run's)."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    stored = checkpoints.load(key)
    if stored is None:
        record = {"method": identity["method"], "fingerprint": digest}
        checkpoints.save(key, checkpoint_json(record))
    elif json.loads(stored).get("fingerprint") != digest:
        raise ConfigError(
            "the checkpoints belong to a run with other parameters", field="checkpoints"
        )


def save_costs(checkpoints: Checkpoints, key: str, costs: LLMCosts, **extra: Any) -> None:
    """The run's LLM costs so far (a resumed run adds to them), with ``extra`` counters."""
    data: dict[str, Any] = dict(costs.as_dict())
    data["wall_seconds"] = costs.wall_seconds
    data.update(extra)
    checkpoints.save(key, checkpoint_json(data))


def load_costs(checkpoints: Checkpoints, key: str) -> dict[str, Any] | None:
    """What :func:`save_costs` saved, or None."""
    saved = checkpoints.load(key)
    return None if saved is None else dict(json.loads(saved))
