"""Measurements taken again after a slow window, and why.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29

- records.remeasured: the record was measured again in a fresh worker after the first worker's
  window closed with a calibration that found it slow (device_agent/calibration.py); its figure
  is the fresh worker's. Records from before this revision are unmarked: nothing could tell then.
- records.slow_index: with remeasured or slow_window, the speed index of the calibration that
  found the window slow (why it was taken again, or marked); NULL otherwise.
- ix_records_job_id_retaken: a job's re-measured and marked records (a job page's "measurements
  re-taken" list reads them on every poll); only those few are indexed.
"""
import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

RETAKEN = sa.text("job_id IS NOT NULL AND (remeasured OR slow_window)")


def upgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("remeasured", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch.add_column(sa.Column("slow_index", sa.Float(), nullable=True))
    op.create_index("ix_records_job_id_retaken", "records", ["job_id", "id"], postgresql_where=RETAKEN,
                    sqlite_where=RETAKEN)


def downgrade() -> None:
    op.drop_index("ix_records_job_id_retaken", table_name="records")
    with op.batch_alter_table("records") as batch:
        batch.drop_column("slow_index")
        batch.drop_column("remeasured")
