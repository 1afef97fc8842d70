"""The review console over plain HTTP (httpx), as a browser would drive it: the start line's
console URL, a signed-in session, a page's CSRF token."""

from __future__ import annotations

import re

import httpx


def console_url(start_line: str) -> str:
    """The console's URL from ``crossaudit serve``'s start line."""
    match = re.search(r"review console on (http://\S+?),", start_line)
    assert match, start_line
    return match.group(1)


def sign_in(url: str, api_key: str) -> httpx.Client:
    """A console session (the sign-in form's double-submit token, as a browser sends it)."""
    h = httpx.Client(base_url=url, follow_redirects=False, timeout=10)
    token = re.search(r'name="csrf_token" value="([^"]+)"', h.get("/signin").text)
    assert token
    r = h.post("/signin", data={"csrf_token": token.group(1), "api_key": api_key, "next": "/queue"})
    assert r.status_code == 303 and r.headers["location"] == "/queue", r.text
    return h


def csrf_of(h: httpx.Client, path: str) -> str:
    """The CSRF token of the page at ``path`` (a signed-in session's)."""
    page = h.get(path)
    assert page.status_code == 200, page.text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert token
    return token.group(1)
