"""Re-measured costs of the best records, and compute definitions of workloads.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

- records.retimed_cost / retimed_at: the median cost from the interleaved re-measurement of a
  task's top candidates at the end of a tuning run. The best of many noisy measurements is
  biased low; apply-best ranks by these when a task has them.
- workloads.definition: the compute DAG as JSON for workloads that are data rather than an
  inventory operator, so a record can be rebuilt anywhere without the user's code.
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("retimed_cost", sa.Float(), nullable=True))
        batch.add_column(sa.Column("retimed_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("definition", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("definition")
    with op.batch_alter_table("records") as batch:
        batch.drop_column("retimed_at")
        batch.drop_column("retimed_cost")
