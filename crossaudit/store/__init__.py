"""Persistence: the :class:`Store` interface (its records are the wire layer's,
:mod:`crossaudit.api.records`), its embedded SQLite implementation and PostgreSQL
(``open_store`` chooses by URL)."""

import os
from typing import Any

from crossaudit.store.base import Store
from crossaudit.store.sqlite import SQLiteStore

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def open_store(target: str | os.PathLike[str], *, postgres_limits: Any = None, **options: Any) -> Store:
    """``postgresql://…`` (or ``postgres://…``): :class:`~crossaudit.store.postgres.PostgresStore`
    (with ``postgres_limits``); anything else is the path of an SQLite file."""
    text = str(target)
    if text.startswith(POSTGRES_SCHEMES):
        from crossaudit.store.postgres import PostgresStore  # psycopg is imported only when used

        return PostgresStore(text, limits=postgres_limits)
    return SQLiteStore(text, **options)


__all__ = ["SQLiteStore", "Store", "open_store"]
