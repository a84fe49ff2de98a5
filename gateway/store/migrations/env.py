"""Alembic environment: runs on the connection handed in by ``gateway.store.db.upgrade``."""

from alembic import context

from gateway.store.models import Base, include_object

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    include_object=include_object,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
