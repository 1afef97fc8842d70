"""Client helpers that need no server: policy sources, review states, TLS options."""

from __future__ import annotations

from pathlib import Path

import pytest

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.sdk.client import _state
from crossaudit.sdk.options import credentials as _credentials
from crossaudit.sdk.sources import policy_source as _policy_source


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


def test_async_client_has_every_method_of_client_with_the_same_parameters() -> None:
    import inspect

    from crossaudit.sdk.client import AsyncClient, Client

    def methods(cls: type) -> dict[str, inspect.Signature]:
        return {
            name: inspect.signature(fn).replace(return_annotation=inspect.Signature.empty)
            for name, fn in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")
        }

    sync, asynchronous = methods(Client), methods(AsyncClient)
    assert sync == asynchronous and len(sync) >= 17
    assert all(inspect.iscoroutinefunction(getattr(AsyncClient, n)) for n in asynchronous if n != "evaluate_many")
    assert inspect.isasyncgenfunction(AsyncClient.evaluate_many)
