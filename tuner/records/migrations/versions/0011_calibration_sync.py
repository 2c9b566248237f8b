"""A calibration's team barrier speed.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

- calibrations.sync_n: millions of barriers a second of a running team of the worker's threads
  (device_agent/calibration.py, calibration version 3): the speed that tells a host whose cores
  pass cache lines slowly for a while, which the FMA tile and the stream do not see. NULL for a
  one-thread worker and for every calibration before version 3 (never compared with version 3).
"""
import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calibrations") as batch:
        batch.add_column(sa.Column("sync_n", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calibrations") as batch:
        batch.drop_column("sync_n")
