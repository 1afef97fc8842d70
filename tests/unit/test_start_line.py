"""The start line's store: the SQLite file, or the PostgreSQL URL with every password masked
(crossaudit/service/server.py ``where_data_lives``; the SQLite form is checked on a real server
in tests/e2e/test_cli_polish.py); and its warning when the decision log is not signed."""

from __future__ import annotations

from pathlib import Path

from crossaudit.service.assembly import start_line, where_data_lives
from crossaudit.service.config import EvidenceConfig, ServerConfig


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


def _line(config: ServerConfig) -> str:
    return start_line(config, 50051, 1, "docker", None, None)


def test_an_unsigned_decision_log_is_said_on_the_start_line(tmp_path: Path) -> None:
    """Replicas sharing PostgreSQL with no signing key keep their logs unsigned: nothing fails
    until an auditor's `audit verify` says FAILED, so the start line says it (docs/evidence.md)."""
    url = "postgresql://app@db/crossaudit"
    line = _line(ServerConfig(data_dir=tmp_path, store_url=url))
    assert "decision log UNSIGNED" in line and "crossaudit audit key --generate" in line, line
    assert line.split(", ")[0] == "crossaudit serving on 127.0.0.1:50051"  # scripts read the 4th word
    key = tmp_path / "signing.pem"
    signed = ServerConfig(data_dir=tmp_path, store_url=url, evidence=EvidenceConfig(signing_key_file=key))
    assert "decision log" not in _line(signed)
    assert "decision log" not in _line(ServerConfig(data_dir=tmp_path))  # SQLite: a key is made in the data dir
    off = _line(ServerConfig(data_dir=tmp_path, evidence=EvidenceConfig(log=False)))
    assert "decision log OFF" in off
    for part in (line, off):  # one part of a comma-separated line each
        assert len(part.split(", ")) == len(_line(signed).split(", ")) + 1
