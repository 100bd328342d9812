"""Alembic environment: runs migrations against the URL the toolmesh config gives."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, event, pool

from shared.db.engine import sqlite_pragmas
from shared.db.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    if connectable.dialect.name == "sqlite":
        # A SQLite file leaves its migration in WAL mode, as every service's connections use
        # it: left in rollback mode, the first connections of services starting together
        # raced to switch it, and one of two doing so at once got "database is locked" at
        # once, whatever its busy timeout. The busy timeout also lets migrations started
        # together wait for each other.
        event.listen(connectable, "connect", sqlite_pragmas)
    with connectable.connect() as connection:
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
