"""Alembic environment for ddpq's SQLite database."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

from ddpq.store.models import Base

config = context.config
url = (
    config.get_main_option("sqlalchemy.url") or f"sqlite:///{os.environ.get('DDPQ_DB', 'ddpq.db')}"
)


def run_migrations() -> None:
    engine = create_engine(url)
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")  # batch mode rebuilds tables
        connection.commit()  # end the autobegun transaction so Alembic's own one commits
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            render_as_batch=True,  # SQLite cannot ALTER most things in place
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations()
