"""Client helpers that need no server: policy sources, review states, TLS options."""

from __future__ import annotations

from pathlib import Path

import pytest

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.sdk.client import _credentials, _policy_source, _state


def test_policy_source_reads_paths_and_passes_text(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("name: x\n")
    assert _policy_source(p) == ("name: x\n", str(p))
    assert _policy_source(str(p)) == ("name: x\n", str(p))
    assert _policy_source("name: x\ndescription: y\n") == ("name: x\ndescription: y\n", "")
    with pytest.raises(InvalidInputError, match="not found"):
        _policy_source(str(tmp_path / "missing.yaml"))


def test_review_states() -> None:
    assert _state(None) == _state("any") == _state("") == 0
    assert _state("approved") != 0
    with pytest.raises(InvalidInputError, match="invalid review state"):
        _state("maybe")


def test_tls_options(tmp_path: Path) -> None:
    assert _credentials(False) is None
    assert _credentials(True) is not None
    with pytest.raises(InvalidInputError, match="CA certificate"):
        _credentials(tmp_path / "nope.pem")
