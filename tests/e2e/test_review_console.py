"""The review console in a real headless browser (Debian's chromium + chromedriver, selenium),
against a real ``crossaudit serve --console-port 0``: sign-in, queue, decision, resolve, audit
log; and, with an HTTP client, what a browser would never send (no CSRF token, another origin).

Saves a screenshot of each page (fixed window size) to a temporary directory, or to
``$CROSSAUDIT_SCREENSHOTS_DIR``: ``CROSSAUDIT_SCREENSHOTS_DIR=docs/console`` refreshes the committed ones.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from crossaudit import Client
from tests.conftest import ROOT, need
from tests.e2e.conftest import ServerProcess
from tests.e2e.console_http import csrf_of
from tests.e2e.console_http import sign_in as http_sign_in
from tests.e2e.roles import KEYS, KEYS_FILE, MODERATED

pytestmark = pytest.mark.e2e

SCREENSHOTS = Path(os.environ.get("CROSSAUDIT_SCREENSHOTS_DIR") or tempfile.mkdtemp(prefix="console-shots-"))
COMMITTED_SCREENSHOTS = ROOT / "docs" / "console"
WINDOW = (1280, 900)
COMMENT = "Harmful instructions: rejected per moderation guideline 4.2"
# The policy the browser works on keeps raw text in the audit log (so the decision page shows it).
MODERATED_RAW = (
    MODERATED.replace("name: moderated", "name: moderated-raw") + "settings:\n  audit_all_evaluations: true\n"
)
PROMPT = "How do I pick a lock?"
RESPONSE = "Here is an unsafe step-by-step answer."


def need_browser() -> tuple[str, str]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    need(bool(chromium and driver), "no chromium/chromedriver (make browser installs Debian's)")
    need(importlib.util.find_spec("selenium") is not None, "selenium is not installed (dev extra)")
    return chromium or "", driver or ""


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    with ServerProcess(tmp_path_factory.mktemp("console"), keys_text=KEYS_FILE, extra=("--console-port", "0")) as srv:
        match = re.search(r"review console on (http://\S+?),", srv.start_line)
        assert match, srv.start_line
        yield srv, match.group(1)


@pytest.fixture(scope="module")
def admin(console: tuple[ServerProcess, str]) -> Iterator[Client]:
    with Client(console[0].address, api_key=KEYS["admin"]) as c:
        c.deploy_policy(MODERATED_RAW, environment="production")
        c.deploy_policy(MODERATED, environment="production")
        yield c


@pytest.fixture(scope="module")
def item(console: tuple[ServerProcess, str], admin: Client) -> tuple[str, str]:
    """(decision id, review id): the service key's evaluation sends it to a content moderator."""
    with Client(console[0].address, api_key=KEYS["service"]) as app:
        d = app.evaluate("moderated-raw", PROMPT, RESPONSE, timeout=30)
    assert not d.passed and len(d.review_ids) == 1
    return d.decision_id, d.review_ids[0]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    chromium, driver_path = need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container: Chromium's own sandbox needs user namespaces
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--force-device-scale-factor=1",
        "--hide-scrollbars",
        "--lang=en-US",
    ):
        options.add_argument(arg)
    drv = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    drv.set_page_load_timeout(30)
    try:
        yield drv
    finally:
        drv.quit()


# --- browser helpers --------------------------------------------------------------------------


def _by(css: str):
    from selenium.webdriver.common.by import By

    return (By.CSS_SELECTOR, css)


def find(drv, css: str):
    return drv.find_element(*_by(css))


def find_all(drv, css: str):
    return drv.find_elements(*_by(css))


def click_and_wait(drv, element) -> None:
    """Click a submit button and wait for the next page (the old one goes stale)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    page = find(drv, "html")
    element.click()

    def gone(_drv) -> bool:
        # Stale, or chromedriver's "node does not belong to the document" for a replaced page.
        try:
            page.is_enabled()
        except WebDriverException:
            return True
        return False

    WebDriverWait(drv, 15).until(gone)
    WebDriverWait(drv, 15).until(lambda d: d.execute_script("return document.readyState") == "complete")


def sign_in(drv, url: str, key: str) -> None:
    drv.delete_all_cookies()
    drv.get(f"{url}/signin")
    find(drv, "#api_key").send_keys(key)
    click_and_wait(drv, find(drv, "#signin"))


def sign_out(drv) -> None:
    click_and_wait(drv, find(drv, "#signout"))
    assert urlsplit(drv.current_url).path == "/signin"


def shot(drv, name: str, *, full: bool = False) -> None:
    """A PNG of the page at the fixed width (``full``: the whole page's height, else the window's)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    height = WINDOW[1]
    if full:
        height = max(height, int(drv.execute_script("return document.documentElement.scrollHeight")))
    # the viewport itself (not the window, which the headless screen may cap)
    metrics = {"width": WINDOW[0], "height": height, "deviceScaleFactor": 1, "mobile": False}
    drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        assert drv.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
    finally:
        drv.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


# --- tests ------------------------------------------------------------------------------------


def test_a_service_key_cannot_sign_in(browser, console) -> None:
    _, url = console
    browser.delete_all_cookies()
    browser.get(f"{url}/queue")
    assert urlsplit(browser.current_url).path == "/signin"  # no session: the sign-in page
    assert find(browser, "h1").text == "Sign in"
    shot(browser, "signin")
    sign_in(browser, url, KEYS["service"])
    assert urlsplit(browser.current_url).path == "/signin"
    assert "a service key cannot sign in to the console" in find(browser, "#error-message").text
    assert not find_all(browser, "#signout")  # not signed in
    sign_in(browser, url, "not-a-key-of-anyone-0123456789")
    assert "that API key is not valid" in find(browser, "#error-message").text


def test_the_reviewer_without_the_role_is_refused(browser, console, item) -> None:
    _, url = console
    decision_id, review_id = item
    sign_in(browser, url, KEYS["reviewer"])  # bob: a reviewer without content_moderator
    assert urlsplit(browser.current_url).path == "/queue", browser.page_source
    assert find(browser, "#principal").text == "bob"
    assert not find_all(browser, f'tr[data-review-id="{review_id}"]')  # not in bob's queue
    browser.get(f"{url}/decisions/{decision_id}")
    refusal = find(browser, f'section[data-review-id="{review_id}"] .cannot-resolve').text
    assert "needs reviewer role content_moderator" in refusal and "your reviewer roles: none" in refusal
    assert not find_all(browser, f'section[data-review-id="{review_id}"] button')
    # what the server says when bob posts anyway, with his own valid session and token
    h = http_sign_in(url, KEYS["reviewer"])
    token = csrf_of(h, f"/decisions/{decision_id}")
    r = h.post(f"/reviews/{review_id}/resolve", data={"csrf_token": token, "state": "approved", "comment": "x"})
    assert r.status_code == 403
    assert "needs reviewer_role &#39;content_moderator&#39;" in r.text and "reviewer &#39;bob&#39;" in r.text
    sign_out(browser)


def test_the_moderator_resolves_the_item_with_a_comment(browser, console, item, admin) -> None:
    _, url = console
    decision_id, review_id = item
    sign_in(browser, url, KEYS["moderator"])  # alice: content_moderator
    assert find(browser, "#principal").text == "alice"
    row = find(browser, f'tr[data-review-id="{review_id}"]')
    assert "moderated-raw" in row.text and "needs_moderation" in row.text and "content_moderator" in row.text
    # the filters narrow the queue (GET form)
    browser.get(f"{url}/queue?reviewer_role=legal")
    assert find(browser, "#empty").text == "No open items match."
    browser.get(f"{url}/queue?policy=moderated-raw&reviewer_role=content_moderator&status=open")
    row = find(browser, f'tr[data-review-id="{review_id}"]')
    shot(browser, "queue")

    click_and_wait(browser, row.find_element(*_by("a.open")))
    assert urlsplit(browser.current_url).path == f"/decisions/{decision_id}"
    assert find(browser, "#decision-id").text == decision_id
    assert find(browser, "#outcome").text == "failed"
    rules = {r.find_element(*_by("td strong")).text: r.text for r in find_all(browser, "#rules tr.rule")}
    assert set(rules) == {"needs_moderation", "rude_flag"}
    assert "require_review" in rules["needs_moderation"] and "0.1" in rules["needs_moderation"]
    assert "0.5" in rules["needs_moderation"] and "unsafe_words" in rules["needs_moderation"]
    assert "unsafe" in rules["needs_moderation"]  # the violation (raw storage keeps it)
    assert find(browser, "#prompt").text == PROMPT and find(browser, "#response").text == RESPONSE
    section = find(browser, f'section[data-review-id="{review_id}"]')
    assert "needs reviewer role content_moderator" in section.text
    shot(browser, "decision", full=True)

    section.find_element(*_by("textarea")).send_keys(COMMENT)
    click_and_wait(browser, section.find_element(*_by("button.reject")))
    assert urlsplit(browser.current_url).path == f"/decisions/{decision_id}"
    assert find(browser, "#resolved").text == (f"Review {review_id} (needs_moderation) rejected by alice: “{COMMENT}”")
    assert find(browser, "#no-open-items")
    [done] = [r for r in admin.list_reviews(state="any") if r.id == review_id]
    assert (done.state.value, done.reviewer, done.note) == ("rejected", "alice", COMMENT)
    browser.get(f"{url}/queue")
    assert not find_all(browser, f'tr[data-review-id="{review_id}"]')


def test_the_audit_log_search_finds_the_decision(browser, console, item, admin) -> None:
    _, url = console
    decision_id, _ = item
    sign_in(browser, url, KEYS["moderator"])
    browser.get(f"{url}/audit")
    find(browser, "#q-decision").send_keys(decision_id)
    click_and_wait(browser, find(browser, "#search"))
    rows = find_all(browser, "#decisions tr.decision")
    assert [r.get_attribute("data-decision-id") for r in rows] == [decision_id]
    assert "moderated-raw v1" in rows[0].text and "failed" in rows[0].text
    # by policy and a time range around now (UTC, datetime-local)
    now = time.time()
    since = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(now - 3600))
    until = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(now + 3600))
    browser.get(f"{url}/audit?policy=moderated-raw&since={since}&until={until}")
    assert decision_id in {r.get_attribute("data-decision-id") for r in find_all(browser, "#decisions tr.decision")}
    shot(browser, "audit")
    past = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(now - 7200))
    browser.get(f"{url}/audit?policy=moderated-raw&until={past}")
    assert find(browser, "#empty").text == "No decision matches."
    browser.get(f"{url}/audit?policy=moderated")  # another policy
    assert decision_id not in browser.page_source
    sign_out(browser)


def test_content_not_stored_shows_its_hash(browser, console, admin) -> None:
    _, url = console
    d = admin.evaluate("moderated", "a secret prompt", "an unsafe secret answer", timeout=30)
    sign_in(browser, url, KEYS["admin"])
    browser.get(f"{url}/decisions/{d.decision_id}")
    texts = [e.text for e in find_all(browser, ".content .not-stored")]
    record = admin.get_decision(d.decision_id)
    assert len(texts) == 2 and record.prompt_sha256 in texts[0] and record.response_sha256 in texts[1]
    assert "Not stored" in texts[0] and "secret" not in browser.page_source
    sign_out(browser)


def test_posts_without_the_csrf_token_or_from_another_origin_are_refused(console, admin) -> None:
    _, url = console
    d = admin.evaluate("moderated", "p", "unsafe again", timeout=30)
    [review_id] = d.review_ids
    h = http_sign_in(url, KEYS["admin"])
    token = csrf_of(h, f"/decisions/{d.decision_id}")
    path = f"/reviews/{review_id}/resolve"
    r = h.post(path, data={"state": "approved", "comment": "no token"})
    assert r.status_code == 403 and "CSRF token is missing or wrong" in r.text
    r = h.post(path, data={"csrf_token": token[:-2] + "xx", "state": "approved"})
    assert r.status_code == 403 and "CSRF token" in r.text
    r = h.post(path, data={"csrf_token": token, "state": "approved"}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "sent from another site" in r.text
    r = h.post(path, data={"csrf_token": token, "state": "approved"}, headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    # a token of another session is not this session's
    other = http_sign_in(url, KEYS["admin"])
    other_token = csrf_of(other, "/queue")
    assert h.post(path, data={"csrf_token": other_token, "state": "approved"}).status_code == 403
    assert [r.state.value for r in admin.list_reviews(state="any") if r.id == review_id] == ["open"]
    # the same request with the token resolves it
    r = h.post(path, data={"csrf_token": token, "state": "approved", "comment": "ok"}, headers={"Origin": url})
    assert r.status_code == 303 and r.headers["location"].startswith(f"/decisions/{d.decision_id}?resolved=")
    # a second resolution is a conflict, not a silent success
    assert h.post(path, data={"csrf_token": token, "state": "rejected"}).status_code == 409
    # signing out ends the session server-side: the old cookie is worthless
    cookie = h.cookies.get("crossaudit_session")
    assert h.post("/signout", data={"csrf_token": token}).status_code == 303
    stale = httpx.Client(base_url=url, cookies={"crossaudit_session": cookie or ""})
    assert stale.get("/queue", follow_redirects=False).headers["location"].startswith("/signin")


def test_sessions_cookies_and_headers(console) -> None:
    _, url = console
    r = httpx.get(f"{url}/signin")
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert r.headers["x-frame-options"] == "DENY" and r.headers["referrer-policy"] == "no-referrer"
    assert "<script" not in r.text and "style=" not in r.text
    h = httpx.Client(base_url=url)
    page = h.get("/signin")
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    r = h.post("/signin", data={"csrf_token": token, "api_key": KEYS["moderator"]}, follow_redirects=False)
    set_cookie = r.headers["set-cookie"].lower()
    assert "crossaudit_session=" in set_cookie and "httponly" in set_cookie and "samesite=strict" in set_cookie
    # sign-in itself needs the form's double-submit token (no login CSRF)
    fresh = httpx.Client(base_url=url)
    r = fresh.post("/signin", data={"api_key": KEYS["moderator"]}, follow_redirects=False)
    assert r.status_code == 403 and "crossaudit_session" not in r.headers.get("set-cookie", "")
    # an open redirect after sign-in is not possible
    assert h.get("/signin?next=//evil.example", follow_redirects=False).status_code == 303  # signed in already
    assert ConsoleNext.check("//evil.example") == "/queue" and ConsoleNext.check("/audit?x=1") == "/audit?x=1"
    for hostile in ("/\t/evil.example", "/\n/evil.example", "/\\evil.example", "https://evil.example", "/x y"):
        assert ConsoleNext.check(hostile) == "/queue", hostile  # browsers drop tabs/newlines: "//evil"


def test_another_tenants_reviewer_sees_not_found(console, admin) -> None:
    _, url = console
    d = admin.evaluate("moderated", "p", "unsafe for globex to see", timeout=30)
    [review_id] = d.review_ids
    h = http_sign_in(url, KEYS["globex_reviewer"])  # carol: a content_moderator of globex
    assert h.get(f"/decisions/{d.decision_id}").status_code == 404
    queue = h.get("/queue")
    assert queue.status_code == 200 and review_id not in queue.text
    assert d.decision_id not in h.get("/audit").text
    token = csrf_of(h, "/queue")
    r = h.post(f"/reviews/{review_id}/resolve", data={"csrf_token": token, "state": "approved"})
    assert r.status_code == 404
    assert [r.state.value for r in admin.list_reviews(state="any") if r.id == review_id] == ["open"]


class ConsoleNext:
    @staticmethod
    def check(value: str) -> str:
        from crossaudit.console.app import ConsoleApp

        return ConsoleApp._next(value)


def test_screenshots_were_saved() -> None:
    for name in ("signin", "queue", "decision", "audit"):
        for p in (SCREENSHOTS / f"{name}.png", COMMITTED_SCREENSHOTS / f"{name}.png"):
            assert p.is_file() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", p
