"""The files the CLI writes for its user (HTML reports, JUnit XML, plots, labelled datasets) are
0600 whatever the umask, whole or not at all (crossaudit/kernel/files.py): they carry policy
details, and a dataset built from reviews carries decisions' retained text."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.files import private_file, write_private

PERMISSIVE_UMASK = 0o022  # the usual default: a file written plainly would be 0644


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    old = os.umask(PERMISSIVE_UMASK)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_report_is_private_and_replaces_a_readable_one(tmp_path: Path, permissive_umask: None) -> None:
    target = tmp_path / "replay.html"
    target.write_text("old")
    target.chmod(0o644)
    write_private(target, "<html>new</html>")
    assert mode(target) == 0o600 and target.read_text() == "<html>new</html>"
    assert [p.name for p in tmp_path.iterdir()] == ["replay.html"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "eval.html"
    target.write_text("old")
    with pytest.raises(RuntimeError), private_file(target) as f:
        f.write(b"half a rep")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["eval.html"]
    with pytest.raises(InvalidInputError, match=r"cannot write .*missing"):
        write_private(tmp_path / "missing" / "report.html", "x")


def test_every_report_writer_writes_0600(tmp_path: Path, permissive_umask: None) -> None:
    from crossaudit.cli.policytest import _write_junit
    from crossaudit.evals.dataset import Row
    from crossaudit.evals.production import write_jsonl
    from crossaudit.evals.sweep import sweep, write_plots

    _write_junit(str(tmp_path / "report.xml"), b"<testsuites/>")
    row = Row(1, "d1", "retained text", "answer", {}, None, None, {"tox": False}, {})
    write_jsonl([row], tmp_path / "ds.jsonl")
    plots = write_plots([sweep("tox", 0.5, [0.1, 0.9, 0.4, 0.6], [True, False, True, False])], tmp_path / "plots")
    written = [tmp_path / "report.xml", tmp_path / "ds.jsonl", *plots]
    assert len(plots) == 2 and {p: mode(p) for p in written} == {p: 0o600 for p in written}
