"""Calibrated measuring workers: their history, and the measurements of slow windows marked.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29

- calibrations: one row per calibration of a measuring worker (device_agent/calibration.py),
  per device key and host: the fixed calibration kernels' speeds on one thread and on all, the
  metrics other processes disturbed, the speed index against the history before it and the
  verdict. A new calibration is judged against the median of the device's newest ones.
- records.slow_window: the record was timed in a window whose closing calibration found the
  worker slow and no healthy worker could measure it again. Records from before this revision
  are unmarked: nothing could tell then.
"""
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "calibrations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("device_key", sa.String(255), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("threads", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("fma_1", sa.Float(), nullable=False),
        sa.Column("fma_n", sa.Float(), nullable=False),
        sa.Column("stream_1", sa.Float(), nullable=False),
        sa.Column("stream_n", sa.Float(), nullable=False),
        sa.Column("disturbed", sa.JSON(), nullable=False),
        sa.Column("speed_index", sa.Float(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_calibrations"),
    )
    op.create_index("ix_calibrations_device_key_host_id", "calibrations", ["device_key", "host", "id"])
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("slow_window", sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.drop_column("slow_window")
    op.drop_index("ix_calibrations_device_key_host_id", table_name="calibrations")
    op.drop_table("calibrations")
