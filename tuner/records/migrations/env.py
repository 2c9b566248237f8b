"""Alembic environment for the records store.

It runs only on a connection handed over by `tuner.records.engine.migrate` (in
`config.attributes["connection"]`), already inside the store's transaction: the whole upgrade
commits or rolls back as one, so a failed open leaves nothing half-written, and no alembic.ini or
database URL is needed here.
"""

from alembic import context

from tuner.records.models import VERSION_TABLE, Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("tunefarm migrations run through tuner.records.open_store(), which supplies the connection")

context.configure(connection=connection, target_metadata=Base.metadata, version_table=VERSION_TABLE,
                  transactional_ddl=True)
with context.begin_transaction():
    context.run_migrations()
