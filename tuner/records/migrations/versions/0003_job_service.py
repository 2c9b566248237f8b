"""The job service: jobs of several tasks, leases, events, API tokens, paging indexes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

- jobs: a job is its submitted spec (JSON) over one or more tasks (job_tasks); `target`,
  `device_key`, `scheduler`, `priority` are columns so workers and listings filter in SQL.
  A running job is leased to one worker (`lease_owner`, `lease_expires_at`), renewed by
  heartbeat; an expired lease is claimed again. `trials_done`, `attempts`, `started_at`,
  `finished_at` say how far and how often it ran. `task_id` stays: the job's first task (a
  job of the previous schema gets it as job_tasks position 0).
- job_tasks: the tasks of a job with their weights and progress (search trials, batches, best and
  baseline cost, failed measurements), written by the worker after every batch, so listing jobs never aggregates records.
- job_events: what happened to a job when (claimed, new best, failed, ...).
- api_tokens: bearer tokens of the REST API, stored as SHA-256 hashes with their scopes.
- records: (task_id, id) and (error_code, id) indexes for newest-first pages filtered by task or
  error code; (task_id, retimed_cost) for a task's best re-measured record.

Downgrading on SQLite copies the jobs table, which (foreign keys on) unlinks records from jobs.
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "job_tasks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("flops", sa.Float(), nullable=True),
        sa.Column("trials", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("batches", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("errors", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("best_cost", sa.Float(), nullable=True),
        sa.Column("best_record_id", sa.Integer(), nullable=True),
        sa.Column("baseline_cost", sa.Float(), nullable=True),
        _ts("updated_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_job_tasks"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_tasks_job_id_jobs", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name="fk_job_tasks_task_id_tasks"),
        sa.UniqueConstraint("job_id", "position", name="uq_job_tasks_job_id_position"),
    )
    op.create_index("ix_job_tasks_task_id", "job_tasks", ["task_id"])
    op.execute("INSERT INTO job_tasks (job_id, position, task_id, weight, trials, batches, errors) "
               "SELECT id, 0, task_id, 1.0, 0, 0, 0 FROM jobs")

    # Plain ADD COLUMNs, no batch table copy: on SQLite a copy drops the old `jobs` table, and
    # with foreign keys on that DROP cascades into job_tasks and nulls records.job_id.
    op.drop_index("ix_jobs_state", table_name="jobs")
    op.add_column("jobs", sa.Column("name", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("spec", sa.JSON(), nullable=False, server_default=sa.text("'{}'")))
    op.add_column("jobs", sa.Column("target", sa.Text(), nullable=False, server_default=""))
    op.add_column("jobs", sa.Column("device_key", sa.String(255), nullable=False, server_default="local"))
    op.add_column("jobs", sa.Column("scheduler", sa.String(32), nullable=False, server_default="gradient"))
    op.add_column("jobs", sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("trials_done", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("lease_owner", sa.String(255), nullable=True))
    op.add_column("jobs", _ts("lease_expires_at", nullable=True))
    op.add_column("jobs", _ts("started_at", nullable=True))
    op.add_column("jobs", _ts("finished_at", nullable=True))
    op.create_index("ix_jobs_state_priority_id", "jobs", ["state", "priority", "id"])
    op.create_index("ix_jobs_state_id", "jobs", ["state", "id"])

    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        _ts("at"),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_job_events"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_events_job_id_jobs", ondelete="CASCADE"),
    )
    op.create_index("ix_job_events_job_id_id", "job_events", ["job_id", "id"])

    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("scopes", sa.String(64), nullable=False),
        _ts("created_at"),
        _ts("last_used_at", nullable=True),
        _ts("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
    )

    op.create_index("ix_records_task_id_id", "records", ["task_id", "id"])
    op.create_index("ix_records_error_code_id", "records", ["error_code", "id"])
    op.create_index("ix_records_task_id_retimed_cost", "records", ["task_id", "retimed_cost"])


def downgrade() -> None:
    op.drop_index("ix_records_task_id_retimed_cost", table_name="records")
    op.drop_index("ix_records_error_code_id", table_name="records")
    op.drop_index("ix_records_task_id_id", table_name="records")
    op.drop_table("api_tokens")
    op.drop_index("ix_job_events_job_id_id", table_name="job_events")
    op.drop_table("job_events")
    op.drop_index("ix_jobs_state_id", table_name="jobs")
    op.drop_index("ix_jobs_state_priority_id", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        for column in ("finished_at", "started_at", "lease_expires_at", "lease_owner", "attempts", "trials_done",
                       "priority", "scheduler", "device_key", "target", "spec", "name"):
            batch.drop_column(column)
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.drop_index("ix_job_tasks_task_id", table_name="job_tasks")
    op.drop_table("job_tasks")
