"""The database: engine, migrations and the shared tables.

- ``db``: engine, transactions (SQLite and PostgreSQL) and ``upgrade`` (Alembic, ``migrations/``);
- ``models``: every table (one metadata for Alembic); ``sql``: ``Store``, the inbox, lanes,
  transcript and outbox; ``prepared``: hot-path statements built once; ``text``: what may be stored.
"""
