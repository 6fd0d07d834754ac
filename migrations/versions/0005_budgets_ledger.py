"""Organisation privacy budgets (issue 14, item 9); every release on the ledger (item 6);
exact (ε, δ) caps and charges (issue 15, item 3).

``organisations`` gains ``epsilon_budget`` and ``delta_budget``. An existing owner
organisation gets the default budget of the time (ε = 10, δ = 10⁻⁶) or, if its datasets'
caps add up to more, exactly their sum: its datasets keep the caps they had, and from
now on every new or raised cap is carved out of what is left. Other organisations hold
no budget.

Amounts become exact: ``datasets.epsilon_cap``/``delta_cap`` and
``ledger_entries.epsilon``/``delta`` change from floats to integers of 10⁻¹² (ε) and
10⁻¹⁸ (δ) (``app.models.FixedPoint``), each float read through its shortest repr (0.1 is
one tenth), a cap rounded down to the unit and a charge up.

``ledger_entries`` gains ``events`` (the releases an entry stands for, as the shared
accountant's events). An existing entry gets one pure-ε event per mechanism of its
``epsilon_by_mechanism``, charged as recorded (the per-class DP-KDE once, on the whole
dataset, as it was charged); its noise scale was not kept, so the event is written per
unit of sensitivity (sensitivity 1, scale 1/ε: the same privacy loss). The table stays
append-only: its triggers are lifted for the migration only. ``ledger_reports`` (new,
append-only) holds the releases each job's engine reports it made.

Downgrading drops the new columns and ``ledger_reports`` (what the reports hold is also
in the jobs' manifests), turns the amounts back into floats, and keeps every other row.

Create Date: 2026-11-24
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

import sqlalchemy as sa
from alembic import op

from migrations.append_only import append_only, lifted
from migrations.columns import json, ref, serial_id, text, timestamp

revision: str = "0005"
down_revision: str | None = "0004"

EPSILON_PLACES, DELTA_PLACES = 12, 18  # app.ledger.amounts (not imported: frozen here)
DEFAULT_EPSILON, DEFAULT_DELTA = Decimal(10), Decimal("1e-6")


def _units(value: float | Decimal, places: int) -> int:
    """A stored float as an integer of ``10**-places``, read through its shortest repr
    and rounded up (a grant of what was there, never less)."""
    exact = Decimal(repr(float(value))) if isinstance(value, float) else Decimal(value)
    return int(exact.scaleb(places).to_integral_value(rounding=ROUND_CEILING))


def _budgets(connection: sa.Connection) -> None:
    owners = connection.execute(sa.text("SELECT id FROM organisations WHERE kind = 'owner'"))
    caps = connection.execute(
        sa.text("SELECT organisation_id, epsilon_cap, delta_cap FROM datasets")
    ).all()
    update = sa.text(
        "UPDATE organisations SET epsilon_budget = :epsilon, delta_budget = :delta WHERE id = :id"
    )
    for (organisation_id,) in owners.all():
        own = [(e, d) for org, e, d in caps if org == organisation_id]
        epsilon = sum((_units(e, EPSILON_PLACES) for e, _ in own), 0)
        delta = sum((_units(d, DELTA_PLACES) for _, d in own), 0)
        connection.execute(
            update,
            {
                "id": organisation_id,
                "epsilon": max(epsilon, _units(DEFAULT_EPSILON, EPSILON_PLACES)),
                "delta": max(delta, _units(DEFAULT_DELTA, DELTA_PLACES)),
            },
        )


_NOISE = {"vocabulary": "discrete_laplace", "class_counts": "discrete_laplace"}
_LEDGER = sa.table(
    "ledger_entries",
    sa.column("id", sa.BigInteger()),
    sa.column("epsilon_by_mechanism", sa.JSON()),
    sa.column("events", sa.JSON()),
)
# (table, column, places, rounding of a float into units, CHECK constraints on it)
_AMOUNTS: tuple[tuple[str, str, int, str, dict[str, str]], ...] = (
    ("datasets", "epsilon_cap", EPSILON_PLACES, ROUND_FLOOR, {"epsilon_cap_positive": "> 0"}),
    ("datasets", "delta_cap", DELTA_PLACES, ROUND_FLOOR, {}),
    ("ledger_entries", "epsilon", EPSILON_PLACES, ROUND_CEILING, {"epsilon_non_negative": ">= 0"}),
    ("ledger_entries", "delta", DELTA_PLACES, ROUND_CEILING, {}),
)


def _legacy_events(by_mechanism: dict[str, float]) -> list[dict[str, object]]:
    return [
        {
            "mechanism": mechanism,
            "name": mechanism,
            "noise": _NOISE.get(mechanism, "laplace"),
            "scale": 1.0 / float(epsilon),
            "sensitivity": 1.0,
            "norm": "l1",
            "dimension": 1,
            "partition": None,
            "count": 1,
            "epsilon": repr(float(epsilon)),
        }
        for mechanism, epsilon in by_mechanism.items()
    ]


def _events(connection: sa.Connection) -> None:
    rows = connection.execute(sa.select(_LEDGER.c.id, _LEDGER.c.epsilon_by_mechanism)).all()
    for entry_id, by_mechanism in rows:
        connection.execute(
            sa.update(_LEDGER)
            .where(_LEDGER.c.id == entry_id)
            .values(events=_legacy_events(by_mechanism or {}))
        )


def _retype(table: str, *, exact: bool) -> None:
    """Rewrite ``table``'s amounts as integers of their unit (``exact``) or back as floats:
    a new column filled row by row, then put in the old one's place."""
    columns = [c for c in _AMOUNTS if c[0] == table]
    connection = op.get_bind()
    new_type = sa.BigInteger() if exact else sa.Float()
    with op.batch_alter_table(table) as batch:
        for _, column, *_rest in columns:
            batch.add_column(sa.Column(f"{column}_new", new_type, nullable=True))
    names = [c[1] for c in columns]
    rows = sa.table(table, sa.column("id"), *(sa.column(n) for n in names))
    target = sa.table(table, sa.column("id"), *(sa.column(f"{n}_new") for n in names))
    for row in connection.execute(sa.select(rows)).all():
        values: dict[str, int | float] = {}
        for (_, column, places, rounding, _checks), value in zip(columns, row[1:], strict=True):
            if exact:
                units = Decimal(repr(float(value))).scaleb(places)
                values[f"{column}_new"] = int(units.to_integral_value(rounding=rounding))
            else:
                values[f"{column}_new"] = float(Decimal(int(value)).scaleb(-places))
        connection.execute(sa.update(target).where(target.c.id == row[0]).values(**values))
    with op.batch_alter_table(table) as batch:
        for _, column, _places, _rounding, checks in columns:
            for name in checks:
                batch.drop_constraint(name, type_="check")
            batch.drop_column(column)
            batch.alter_column(f"{column}_new", new_column_name=column, nullable=False)
            for name, condition in checks.items():
                batch.create_check_constraint(name, f"{column} {condition}")


def upgrade() -> None:
    with op.batch_alter_table("organisations") as batch:
        batch.add_column(
            sa.Column("epsilon_budget", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("delta_budget", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.create_check_constraint("epsilon_budget_non_negative", "epsilon_budget >= 0")
        batch.create_check_constraint("delta_budget_non_negative", "delta_budget >= 0")
    _budgets(op.get_bind())
    _retype("datasets", exact=True)
    with lifted("ledger_entries"):
        op.add_column(
            "ledger_entries",
            sa.Column("events", sa.JSON(), nullable=False, server_default="[]"),
        )
        _events(op.get_bind())
        _retype("ledger_entries", exact=True)
    op.create_table(
        "ledger_reports",
        serial_id(),
        ref("dataset_id", "datasets"),
        ref("job_id", "jobs"),
        sa.Column("epsilon", sa.BigInteger(), nullable=False),
        sa.Column("delta", sa.BigInteger(), nullable=False),
        json("events"),
        text("accountant", 200),
        text("actor", 80),
        timestamp("created_at"),
        sa.UniqueConstraint("job_id"),
    )
    op.create_index("ix_ledger_reports_dataset_id", "ledger_reports", ["dataset_id"])
    append_only("ledger_reports")


def downgrade() -> None:
    op.drop_table("ledger_reports")  # its index and triggers go with it
    with lifted("ledger_entries"):
        _retype("ledger_entries", exact=False)
        with op.batch_alter_table("ledger_entries") as batch:
            batch.drop_column("events")
    _retype("datasets", exact=False)
    with op.batch_alter_table("organisations") as batch:
        batch.drop_constraint("delta_budget_non_negative", type_="check")
        batch.drop_constraint("epsilon_budget_non_negative", type_="check")
        batch.drop_column("delta_budget")
        batch.drop_column("epsilon_budget")
