"""Organisation privacy budgets (issue 14, item 9).

``organisations`` gains ``epsilon_budget`` and ``delta_budget``: exact amounts, integers
of 10⁻¹² (ε) and 10⁻¹⁸ (δ) (``app.models.FixedPoint``). An existing owner organisation
gets the default budget of the time (ε = 10, δ = 10⁻⁶) or, if its datasets' caps add up
to more, exactly their sum: its datasets keep the caps they had, and from now on every
new or raised cap is carved out of what is left. Other organisations hold no budget.
Downgrading drops the two columns and keeps every other row.

Revision ID: 0005
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import ROUND_CEILING, Decimal

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

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


def downgrade() -> None:
    with op.batch_alter_table("organisations") as batch:
        batch.drop_constraint("delta_budget_non_negative", type_="check")
        batch.drop_constraint("epsilon_budget_non_negative", type_="check")
        batch.drop_column("delta_budget")
        batch.drop_column("epsilon_budget")
