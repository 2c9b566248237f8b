"""The measurement protocol's summary of every timing, and how disturbed a job's timings were.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25

- records.min_cost / cost_spread / samples: the fastest sample, the interquartile range over the
  median, and how many samples the figure (`mean_cost`, which holds the protocol's median since
  this revision) is taken from.
- records.disturbed / lost_fraction / host_busy: whether other processes kept the kernel waiting
  even after the protocol's retries, the share of the kernel threads' time they lost, and how
  many CPUs' worth of other work ran meanwhile. NULL for records from before the protocol.
- records.retimed_spread / beats_default: from the end-of-run re-measurement, the spread of a
  candidate's per-round figures, and whether it beat the default schedule beyond the noise
  (NULL for the default itself and for records not re-measured). A re-measured record that did
  not beat the default ranks after it, so apply-best builds the default.
- job_tasks.timings / disturbed_timings: the job's timings of the task and how many of them were
  disturbed (the job document's `disturbed_fraction`).
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("min_cost", sa.Float(), nullable=True))
        batch.add_column(sa.Column("cost_spread", sa.Float(), nullable=True))
        batch.add_column(sa.Column("samples", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("disturbed", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("lost_fraction", sa.Float(), nullable=True))
        batch.add_column(sa.Column("host_busy", sa.Float(), nullable=True))
        batch.add_column(sa.Column("retimed_spread", sa.Float(), nullable=True))
        batch.add_column(sa.Column("beats_default", sa.Boolean(), nullable=True))
    with op.batch_alter_table("job_tasks") as batch:
        batch.add_column(sa.Column("timings", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("disturbed_timings", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("job_tasks") as batch:
        batch.drop_column("disturbed_timings")
        batch.drop_column("timings")
    with op.batch_alter_table("records") as batch:
        for name in ("beats_default", "retimed_spread", "host_busy", "lost_fraction", "disturbed", "samples",
                     "cost_spread", "min_cost"):
            batch.drop_column(name)
