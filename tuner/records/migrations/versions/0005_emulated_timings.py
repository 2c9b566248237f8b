"""Timings taken under an instruction-set emulator are labelled.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25

- records.emulated: the record was timed by an agent that runs emulated (an aarch64 board under
  qemu-user on an x86 host). Such figures are the emulator's, not the device's: the API and the
  dashboard say so, and the cost model never trains on them together with native ones. Records
  from before this revision are marked native: no agent could say otherwise then.
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("emulated", sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.drop_column("emulated")
