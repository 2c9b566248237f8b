"""Indexes of the records that a bulk import does not pay for.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28

Every index of `records` is kept up on every insert; at a million records the index upkeep was
most of an import's time in the database. Three indexes held mostly entries no query reads:
- ix_records_fingerprint: every lookup by fingerprint names the task too, and the
  (task_id, fingerprint) unique index serves it; dropped.
- ix_records_job_id: imported records and measurements outside a job have no job; only records
  with one are indexed (a query on `job_id = x` implies it is not NULL).
- ix_records_task_id_retimed_cost: only re-measured records have a re-measured cost, and every
  ranking by it asks `retimed_cost IS NOT NULL`; only those are indexed.
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

JOB = sa.text("job_id IS NOT NULL")
RETIMED = sa.text("retimed_cost IS NOT NULL")


def upgrade() -> None:
    op.drop_index("ix_records_fingerprint", table_name="records")
    op.drop_index("ix_records_job_id", table_name="records")
    op.drop_index("ix_records_task_id_retimed_cost", table_name="records")
    op.create_index("ix_records_job_id", "records", ["job_id"], postgresql_where=JOB, sqlite_where=JOB)
    op.create_index("ix_records_task_id_retimed_cost", "records", ["task_id", "retimed_cost"],
                    postgresql_where=RETIMED, sqlite_where=RETIMED)


def downgrade() -> None:
    op.drop_index("ix_records_task_id_retimed_cost", table_name="records")
    op.drop_index("ix_records_job_id", table_name="records")
    op.create_index("ix_records_task_id_retimed_cost", "records", ["task_id", "retimed_cost"])
    op.create_index("ix_records_job_id", "records", ["job_id"])
    op.create_index("ix_records_fingerprint", "records", ["fingerprint"])
