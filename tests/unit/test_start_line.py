"""The start line's store: the SQLite file, or the PostgreSQL URL with every password masked
(crossaudit/service/server.py ``where_data_lives``; the SQLite form is checked on a real server
in tests/e2e/test_cli_polish.py)."""

from __future__ import annotations

from pathlib import Path

from crossaudit.service.config import ServerConfig
from crossaudit.service.server import where_data_lives


def test_sqlite_is_the_database_file(tmp_path: Path) -> None:
    config = ServerConfig(data_dir=tmp_path / "data")
    assert where_data_lives(config) == f"sqlite {(tmp_path / 'data' / 'crossaudit.db').resolve()}"


def test_postgresql_shows_the_url_without_any_password(tmp_path: Path) -> None:
    for url, shown in [
        ("postgresql://app:s3cret@db.internal:5432/crossaudit", "postgresql://app:***@db.internal:5432/crossaudit"),
        ("postgresql://app@db/crossaudit?password=s3cret&sslmode=require",
         "postgresql://app@db/crossaudit?password=***&sslmode=require"),
        ("postgresql://app:p%40ss@db/x?sslmode=require&PASSWORD=s3cret", "postgresql://app:***@db/x?sslmode=require&PASSWORD=***"),
    ]:  # fmt: skip
        assert where_data_lives(ServerConfig(data_dir=tmp_path, store_url=url)) == shown
        assert "s3cret" not in shown and "p%40ss" not in shown
