"""Column, index and table definitions the revisions share.

Frozen with the revisions that use them: a change here changes what every past revision
makes, so add a helper rather than alter one. Constraint names are left to the naming
convention of ``app.models.Base.metadata``, which env.py hands to Alembic.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def uuid_id() -> sa.Column[object]:
    return sa.Column("id", sa.Uuid(), primary_key=True)


def serial_id() -> sa.Column[object]:
    return sa.Column("id", BIG_ID, primary_key=True, autoincrement=True)


def timestamp(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def text(name: str, length: int | None = None, *, nullable: bool = False) -> sa.Column[object]:
    """A string of at most ``length`` characters, or unbounded text without one."""
    kind = sa.String(length) if length else sa.Text()
    return sa.Column(name, kind, nullable=nullable)


def integer(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.Integer(), nullable=False)


def json(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.JSON(), nullable=nullable)


def ref(
    name: str, table: str, *, nullable: bool = False, ondelete: str | None = None
) -> sa.Column[object]:
    """A UUID column referring to ``table.id``."""
    return sa.Column(
        name, sa.Uuid(), sa.ForeignKey(f"{table}.id", ondelete=ondelete), nullable=nullable
    )


def job_table(name: str, *columns: sa.SchemaItem) -> None:
    """A table whose rows belong to a job: ``job_id`` first, and deleted with the job."""
    op.create_table(name, ref("job_id", "jobs", ondelete="CASCADE"), *columns)


def one_of(column: str, *values: str) -> sa.CheckConstraint:
    listed = ", ".join(f"'{v}'" for v in values)
    return sa.CheckConstraint(f"{column} IN ({listed})", name=f"{column}_valid")


def index(table: str, *columns: str, name: str | None = None) -> None:
    op.create_index(name or f"ix_{table}_{columns[0]}", table, list(columns))
