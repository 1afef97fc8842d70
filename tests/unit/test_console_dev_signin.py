"""Under ``serve --dev`` any string signs in to the review console (there are no API keys): the
sign-in page and the start line say so, where a new user would otherwise look for a key that
does not exist. With an API-keys file the page asks for the key, as before."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx

from crossaudit.console.app import ConsoleApp
from crossaudit.service.assembly import start_line
from crossaudit.service.auth import Authenticator
from crossaudit.service.config import ConsoleLimits, ServerConfig
from tests.e2e.console_http import console_url

URL = "http://127.0.0.1:8081"


def _signin_page(auth: Authenticator) -> str:
    """The sign-in page as the console serves it (in-process ASGI; the page reads no records)."""
    app = ConsoleApp(records=None, auth=auth, limits=ConsoleLimits(), tls=False)  # type: ignore[arg-type]

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app.asgi), base_url=URL) as client:
            return await client.get("/signin")

    page = asyncio.run(get())
    assert page.status_code == 200
    return page.text


def test_the_dev_sign_in_page_says_any_string_signs_in() -> None:
    text = _signin_page(Authenticator.dev_mode())
    assert re.search(r"any string signs in", text) and "default" in text
    assert 'id="dev-signin"' in text


def test_with_api_keys_the_page_asks_for_the_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text('tenants:\n  acme:\n    keys: ["acme-key-at-least-16-chars"]\n')
    keys.chmod(0o600)
    text = _signin_page(Authenticator.from_file(keys))
    assert "any string" not in text and "sign in with their API key" in text


def _line(**settings: Any) -> str:
    return start_line(ServerConfig(**settings), 50051, 1, "process", URL, 9464)


def test_the_dev_start_line_says_it_too(tmp_path: Path) -> None:
    dev = _line(data_dir=tmp_path, dev=True)
    assert "console sign-in: any string (--dev)" in dev
    assert console_url(dev) == URL  # scripts still find the console's address
    assert "any string" not in _line(data_dir=tmp_path, api_keys_file=tmp_path / "keys.yaml")
