"""Each task keeps how many records it has.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28

- tasks.record_count: the task's records, added to in the same transaction as the records
  themselves (the store's two insert paths, a batch of measurements and an import). The
  workload and target listings and the store's total sum these few task rows instead of
  counting a million records. Filled from the records at the upgrade.
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("record_count", sa.Integer(), server_default="0", nullable=False))
    op.execute("UPDATE tasks SET record_count = (SELECT COUNT(*) FROM records WHERE records.task_id = tasks.id)")


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("record_count")
