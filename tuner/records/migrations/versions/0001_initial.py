"""Initial schema: workloads, tasks, jobs, records, agents.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Written by hand to match tuner/records/models.py; tests/test_records.py checks that they agree.
Migrations use plain SQLAlchemy types (not the models' classes) so they stay fixed when the
models change later.
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _ts(name, nullable=False):
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "workloads",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("canonical", sa.Text(), nullable=True),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("key", name="pk_workloads"),
    )
    op.create_table(
        "tasks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_key", sa.String(64), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("device_key", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tasks"),
        sa.ForeignKeyConstraint(["workload_key"], ["workloads.key"], name="fk_tasks_workload_key_workloads"),
        sa.UniqueConstraint("workload_key", "target", "device_key", name="uq_tasks_workload_key_target_device_key"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("space", sa.Text(), nullable=False),
        sa.Column("strategy", sa.String(64), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        _ts("created_at"),
        _ts("updated_at"),
        _ts("heartbeat_at", nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name="fk_jobs_task_id_tasks"),
        sa.CheckConstraint("state IN ('queued', 'running', 'done', 'failed', 'cancelled')", name="ck_jobs_state"),
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_index("ix_jobs_task_id", "jobs", ["task_id"])
    op.create_table(
        "records",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("candidate_kind", sa.String(16), nullable=False),
        sa.Column("candidate", sa.JSON(), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("costs", sa.JSON(), nullable=False),
        sa.Column("mean_cost", sa.Float(), nullable=True),
        sa.Column("error_code", sa.Integer(), nullable=False),
        sa.Column("error_msg", sa.Text(), nullable=False),
        sa.Column("build_seconds", sa.Float(), nullable=False),
        sa.Column("run_seconds", sa.Float(), nullable=False),
        sa.Column("measured_by", sa.String(255), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_records"),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name="fk_records_task_id_tasks"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_records_job_id_jobs", ondelete="SET NULL"),
        sa.UniqueConstraint("task_id", "fingerprint", name="uq_records_task_id_fingerprint"),
    )
    op.create_index("ix_records_fingerprint", "records", ["fingerprint"])
    op.create_index("ix_records_job_id", "records", ["job_id"])
    op.create_index("ix_records_task_id_mean_cost", "records", ["task_id", "mean_cost"])
    op.create_table(
        "agents",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("device_key", sa.String(255), nullable=False),
        sa.Column("info", sa.JSON(), nullable=False),
        _ts("last_seen"),
        sa.PrimaryKeyConstraint("name", name="pk_agents"),
    )
    op.create_index("ix_agents_device_key", "agents", ["device_key"])


def downgrade() -> None:
    for table in ("agents", "records", "jobs", "tasks", "workloads"):
        op.drop_table(table)
