"""A task's records timed in a slow window, by figure.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30

- ix_records_task_id_mean_cost_slow: (task_id, mean_cost) of the records a calibration found
  slow (records.slow_window), and only those. best() ranks them after every other record of a
  task, in a statement of their own; without this index that statement read the task's whole
  (task_id, mean_cost) range to find none (6.5 ms a task of 8000 records, every GET /best).
  The predicate is spelled as SQLAlchemy spells `slow_window IS true` on each back-end, so each
  planner matches it term for term.
"""
import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_records_task_id_mean_cost_slow", "records", ["task_id", "mean_cost"],
                    postgresql_where=sa.text("slow_window IS true"), sqlite_where=sa.text("slow_window IS 1"))


def downgrade() -> None:
    op.drop_index("ix_records_task_id_mean_cost_slow", table_name="records")
