"""The review console's Starlette application: sign-in, queue, decision, resolve, audit log,
the shadow/canary report of a policy (``/rollout``) and each rule's measured precision from
reviews and feedback (``/rules``, docs/calibration.md).

Every page acts as the signed-in :class:`~crossaudit.service.principals.Principal` through the
same service-layer code as the gRPC API (:class:`~crossaudit.governance.records.Records`), so a
role, a reviewer role or a tenant boundary is enforced once. Every page also checks the RPC it
stands for in the one permission table (queue = ListReviews, decision = GetDecision, resolve =
ResolveReview, audit log and rules = ListDecisions).

Browser-side defences: the session cookie is HttpOnly, SameSite=Strict (Secure and
``__Host-``-prefixed over TLS); every POST carries the session's CSRF token in a hidden field
(compared with :func:`hmac.compare_digest`) and is refused when its ``Origin``, ``Referer`` or
``Sec-Fetch-Site`` says another site sent it; sign-in uses a double-submit token of its own.
Responses carry a Content-Security-Policy without any script or inline style, X-Frame-Options
DENY, Referrer-Policy no-referrer and ``Cache-Control: no-store``. Templates autoescape.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crossaudit.api.limits import DEFAULT_ENVIRONMENT
from crossaudit.api.records import AuditRecord, ReviewRecord
from crossaudit.console.sessions import Session, Sessions, SessionsFull, key_id, new_token, tokens_match
from crossaudit.governance.labels import Labels
from crossaudit.governance.records import Records
from crossaudit.governance.rollout import Rollout
from crossaudit.kernel.errors import (
    CrossAuditError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
    ReviewAlreadyResolvedError,
    UnauthenticatedError,
)
from crossaudit.kernel.listen import client_key
from crossaudit.service.auth import Authenticator
from crossaudit.service.config import ConsoleLimits
from crossaudit.service.principals import (
    CONSOLE_ROLES,
    GET_DECISION,
    LIST_DECISIONS,
    LIST_REVIEWS,
    RESOLVE_REVIEW,
    REVIEWER_ROLE_PARAM,
    SHADOW_REPORT,
    Principal,
)
from orchestrator import reviews
from orchestrator.reviews import ReviewState

log = logging.getLogger("crossaudit.console")

SESSION_COOKIE = "crossaudit_session"
SIGNIN_COOKIE = "crossaudit_signin"  # the sign-in form's double-submit token
SECURE_PREFIX = "__Host-"  # over TLS: Secure, Path=/, no Domain (browsers enforce it)
CSRF_FIELD = "csrf_token"
MAX_FORM_FIELDS = 16
QUEUE_STATUSES = ("open", "overdue", "escalated")
RESOLUTIONS = {"approved": ReviewState.APPROVED, "rejected": ReviewState.REJECTED, "dismissed": ReviewState.DISMISSED}
TIME_INPUT_FORMAT = "%Y-%m-%dT%H:%M"  # <input type="datetime-local">, read as UTC

SECURITY_HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'none'; style-src 'self'; img-src 'self'; object-src 'none'; "
        b"base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` (and ``Cache-Control: no-store`` unless set) to every answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in dict(SECURITY_HEADERS)]
                headers.extend(SECURITY_HEADERS)
                if not any(k.lower() == b"cache-control" for k, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


# Host names a browser may use for a console listening on loopback (``Host`` without the port).
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


class LoopbackHostOnly:
    """A console on loopback answers only requests addressed to a loopback name.

    DNS rebinding: a web page from ``evil.example`` whose name later resolves to 127.0.0.1 is,
    to the browser, same-origin with the console, so Origin checks and SameSite cookies do not
    stop it; its ``Host`` header still says ``evil.example``. This matters most under ``--dev``,
    where any key signs in."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            try:
                name = urlsplit("//" + host).hostname if host else None
            except ValueError:  # "[" and the like
                name = None
            if name not in LOOPBACK_NAMES:
                response = Response(
                    "refused: this console answers only at 127.0.0.1, localhost or [::1]\n",
                    status_code=403,
                    media_type="text/plain",
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


_LOCAL_PATH = re.compile(r"/[A-Za-z0-9/_.~%?=&+-]*")


class Refused(Exception):
    """An answer other than the page: status and a message for the person."""

    # Internal only, not in crossaudit.kernel.errors: an HTTP answer of the console, caught in
    # this module; it never crosses the gRPC edge.

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# --- formatting -----------------------------------------------------------------------------


def fmt_time(value: Any) -> str:
    if isinstance(value, str):
        value = reviews.iso_seconds(value)
    if value is None:
        return ""
    return dt.datetime.fromtimestamp(float(value), dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else f"{value:.1f}"
    return str(value)


def fmt_share(value: float | None) -> str:
    """A proportion as a percentage with one decimal ("undefined" when there is none)."""
    return "undefined" if value is None else f"{100 * value:.1f}%"


def parse_time(value: str, what: str) -> float | None:
    """A ``datetime-local`` value (UTC) or epoch seconds → epoch seconds; empty → None."""
    value = value.strip()
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        ts = dt.datetime.fromisoformat(value)
    except ValueError:
        raise Refused(400, f"{what}: give a time as YYYY-MM-DDTHH:MM (UTC) or epoch seconds") from None
    return (ts if ts.tzinfo else ts.replace(tzinfo=dt.UTC)).timestamp()


def policy_filter(request: Request) -> tuple[str, str]:
    """The policy and environment a page is asked about (``?policy=&environment=``; the default
    environment when none is given)."""
    q = request.query_params
    return q.get("policy", "").strip(), q.get("environment", "").strip() or DEFAULT_ENVIRONMENT


# --- the application ------------------------------------------------------------------------


@dataclass
class QueueRow:
    review: ReviewRecord
    reviewer_role: str
    severity: str
    overdue: bool
    escalated: bool
    due: str
    may_resolve: bool


class ConsoleApp:
    def __init__(
        self,
        records: Records,
        auth: Authenticator,
        limits: ConsoleLimits,
        *,
        tls: bool,
        loopback_only: bool = False,
        rollout: Rollout | None = None,
        labels: Labels | None = None,
    ) -> None:
        self.records = records
        self.labels = labels  # each rule's precision from labels (crossaudit.governance.labels)
        self.rollout = rollout  # shadow and canary reports (crossaudit.governance.rollout)
        self.auth = auth
        self.limits = limits
        self.tls = tls
        self.sessions = Sessions(limits)
        self.session_cookie = (SECURE_PREFIX if tls else "") + SESSION_COOKIE
        self.signin_cookie = (SECURE_PREFIX if tls else "") + SIGNIN_COOKIE
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("crossaudit.console", "templates"),
            autoescape=True,  # every template, whatever its extension
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["time"] = fmt_time
        self.templates.filters["number"] = fmt_number
        self.templates.filters["share"] = fmt_share
        self.templates.globals["shadow_report_method"] = SHADOW_REPORT  # the nav shows Rollout to who may see it
        self.css = resources.files("crossaudit.console").joinpath("static/console.css").read_bytes()
        self.app = Starlette(
            routes=[
                Route("/", self.home, methods=["GET"]),
                Route("/static/console.css", self.stylesheet, methods=["GET"]),
                Route("/signin", self.signin_form, methods=["GET"]),
                Route("/signin", self.signin, methods=["POST"]),
                Route("/signout", self.page(self.signout, post=True), methods=["POST"]),
                Route("/queue", self.page(self.queue, LIST_REVIEWS), methods=["GET"]),
                Route("/decisions/{decision_id}", self.page(self.decision, GET_DECISION), methods=["GET"]),
                Route(
                    "/reviews/{review_id}/resolve", self.page(self.resolve, RESOLVE_REVIEW, post=True), methods=["POST"]
                ),
                Route("/audit", self.page(self.audit, LIST_DECISIONS), methods=["GET"]),
                Route("/rollout", self.page(self.rollout_page, SHADOW_REPORT), methods=["GET"]),
                Route("/rules", self.page(self.rules_page, LIST_DECISIONS), methods=["GET"]),
            ],
        )
        self.asgi: ASGIApp = SecurityHeaders(LoopbackHostOnly(self.app) if loopback_only else self.app)

    # --- plumbing -------------------------------------------------------------------------

    def render(self, template: str, http_status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("session", None)
        html = self.templates.get_template(template).render(**context)
        return HTMLResponse(html, status_code=http_status)

    def refusal(self, status: int, message: str, session: Session | None) -> HTMLResponse:
        return self.render("error.html", status, status=status, message=message, session=session)

    def _set_cookie(self, response: Response, name: str, value: str, path: str = "/") -> None:
        response.set_cookie(name, value, path=path, httponly=True, samesite="strict", secure=self.tls)

    def _clear_cookie(self, response: Response, name: str, path: str = "/") -> None:
        response.delete_cookie(name, path=path, httponly=True, samesite="strict", secure=self.tls)

    @staticmethod
    def _same_origin(request: Request) -> bool:
        """False when the browser says another site sent the request. ``Origin: null`` (sent
        under Referrer-Policy no-referrer) and absent headers say nothing: the token decides."""
        host = request.headers.get("host", "")
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return False
        origin = request.headers.get("origin")
        if origin and origin != "null" and urlsplit(origin).netloc != host:
            return False
        referer = request.headers.get("referer")
        return not (referer and urlsplit(referer).netloc != host)

    async def _form(self, request: Request) -> dict[str, str]:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/x-www-form-urlencoded":
            raise Refused(415, "forms are sent as application/x-www-form-urlencoded")
        size = 0
        chunks = []
        try:  # a form trickled in forever would hold one of max_concurrent_requests for good
            async with asyncio.timeout(self.limits.body_timeout_s):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > self.limits.max_form_bytes:
                        raise Refused(413, f"the form is larger than {self.limits.max_form_bytes} bytes")
                    chunks.append(chunk)
        except TimeoutError:
            raise Refused(408, f"the form did not arrive within {self.limits.body_timeout_s:g}s") from None
        try:
            fields = parse_qs(b"".join(chunks).decode("utf-8"), keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
        except (UnicodeDecodeError, ValueError):
            raise Refused(400, "the form does not decode") from None
        return {k: v[-1] for k, v in fields.items()}

    def _session(self, request: Request) -> Session | None:
        return self.sessions.get(request.cookies.get(self.session_cookie))

    def page(
        self,
        handler: Callable[[Request, Session, dict[str, str]], Awaitable[Response]],
        method: str | None = None,
        *,
        post: bool = False,
    ) -> Callable[[Request], Awaitable[Response]]:
        """Session, CSRF (POST), permission of ``method``, and errors as pages."""

        async def endpoint(request: Request) -> Response:
            session = self._session(request)
            try:
                if session is None:
                    if post:
                        raise Refused(403, "sign in first (your session expired or does not exist)")
                    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                    return RedirectResponse(f"/signin?next={quote(target, safe='')}", status_code=303)
                form: dict[str, str] = {}
                if post:
                    if not self._same_origin(request):
                        raise Refused(403, "refused: this form was sent from another site")
                    form = await self._form(request)
                    if not tokens_match(session.csrf, form.get(CSRF_FIELD)):
                        raise Refused(403, "refused: the form's CSRF token is missing or wrong; reload the page")
                if method is not None:
                    session.principal.require(method)
                return await handler(request, session, form)
            except Refused as r:
                return self.refusal(r.status, r.message, session)
            except PermissionDeniedError as e:
                return self.refusal(403, e.message, session)
            except NotFoundError as e:
                return self.refusal(404, e.message, session)
            except ReviewAlreadyResolvedError as e:
                return self.refusal(409, e.message, session)
            except InvalidInputError as e:
                return self.refusal(400, e.message, session)
            except CrossAuditError as e:
                log.warning("console: %s failed: %s", request.url.path, e)
                return self.refusal(503, "the service could not answer; try again", session)
            except Exception:
                log.exception("console: %s failed with an unexpected error", request.url.path)
                return self.refusal(500, "internal error (see the server log)", session)

        return endpoint

    # --- pages ----------------------------------------------------------------------------

    async def home(self, request: Request) -> Response:
        return RedirectResponse("/queue" if self._session(request) else "/signin", status_code=303)

    async def stylesheet(self, request: Request) -> Response:
        return Response(self.css, media_type="text/css", headers={"cache-control": "max-age=300"})

    def _signin_page(self, status: int = 200, message: str = "", next_path: str = "/queue") -> Response:
        token = new_token()
        # --dev accepts any string (Authenticator.dev_mode): a page asking for "your API key"
        # would send a new user looking for a key that does not exist.
        response = self.render("signin.html", status, csrf=token, message=message, next=next_path, dev=self.auth.dev)
        self._set_cookie(response, self.signin_cookie, token, path="/signin")
        return response

    @staticmethod
    def _next(value: str | None) -> str:
        """Where to go after sign-in: a local path only (no open redirect). A whitelist, since
        browsers drop tabs and newlines from URLs ("/\t/evil.example" would become "//evil.example")."""
        if not value or not _LOCAL_PATH.fullmatch(value) or value.startswith("//"):
            return "/queue"
        return value

    async def signin_form(self, request: Request) -> Response:
        if self._session(request) is not None:
            return RedirectResponse("/queue", status_code=303)
        return self._signin_page(next_path=self._next(request.query_params.get("next")))

    async def signin(self, request: Request) -> Response:
        client = client_key(request.client.host if request.client else None)
        try:
            if not self._same_origin(request):
                raise Refused(403, "refused: this form was sent from another site")
            form = await self._form(request)
            if not tokens_match(request.cookies.get(self.signin_cookie, ""), form.get(CSRF_FIELD)):
                raise Refused(403, "refused: the sign-in form expired; try again")
            if self.sessions.throttled(client):
                raise Refused(429, "too many failed sign-ins; wait a minute")
            too_many = self.sessions.signins_throttled(client=client)
            if too_many:
                raise Refused(429, too_many)
            api_key = (form.get("api_key") or "").strip()
            try:
                principal = self.auth.principal_for_key(api_key or None)
            except UnauthenticatedError:
                self.sessions.failed(client)
                raise Refused(401, "that API key is not valid") from None
            if principal.role not in CONSOLE_ROLES:
                raise Refused(
                    403, f"a {principal.role.value} key cannot sign in to the console (it is an application's)"
                )
            key = key_id(api_key)
            too_many = self.sessions.signins_throttled(client=client, key=key)
            if too_many:
                raise Refused(429, too_many)
            self.sessions.drop(request.cookies.get(self.session_cookie))
            try:
                session_id, _ = self.sessions.create(principal, key)
            except SessionsFull as full:
                log.warning("console: sign-in of %s refused: %s", principal.describe(), full)
                raise Refused(
                    503,
                    "the console is full (as many sessions as it may hold are signed in); try again "
                    "later (operators: console_limits.max_sessions)",
                ) from None
            self.sessions.signed_in(client=client, key=key)
        except Refused as r:
            return self._signin_page(r.status, r.message)
        log.info("console: %s of tenant %s signed in", principal.describe(), principal.tenant)
        response = RedirectResponse(self._next(form.get("next")), status_code=303)
        self._set_cookie(response, self.session_cookie, session_id)
        self._clear_cookie(response, self.signin_cookie, path="/signin")
        return response

    async def signout(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        self.sessions.drop(request.cookies.get(self.session_cookie))
        response = RedirectResponse("/signin", status_code=303)
        self._clear_cookie(response, self.session_cookie)
        return response

    async def queue(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        p = session.principal
        q = request.query_params
        policy = q.get("policy", "").strip()
        role = q.get("reviewer_role", "").strip()
        severity = q.get("severity", "").strip()
        status = q.get("status", "open").strip() or "open"
        if status not in QUEUE_STATUSES:
            raise Refused(400, f"status is one of {', '.join(QUEUE_STATUSES)}")
        items = await self.records.list_reviews(p.tenant, state=ReviewState.OPEN, policy=policy, principal=p)
        now = time.time()
        rows: list[QueueRow] = []
        roles: set[str] = set()
        severities: set[str] = set()
        policies: set[str] = set()
        for r in items:
            at = reviews.timing(r.kind, r.state, r.params, now)
            row = QueueRow(
                review=r,
                reviewer_role=str(r.params.get(REVIEWER_ROLE_PARAM) or ""),
                severity=str(r.params.get("severity") or ""),
                overdue=at.overdue,
                escalated=at.escalated,
                due=str(r.params.get(reviews.DUE_AT) or r.params.get(reviews.ESCALATE_AT) or ""),
                may_resolve=p.may_resolve(r.params.get(REVIEWER_ROLE_PARAM)),
            )
            roles.add(row.reviewer_role)
            severities.add(row.severity)
            policies.add(r.policy)
            if role and row.reviewer_role != ("" if role == "-" else role):
                continue
            if severity and row.severity != severity:
                continue
            if (status == "overdue" and not row.overdue) or (status == "escalated" and not row.escalated):
                continue
            rows.append(row)
        shown = rows[: self.limits.page_items]
        return self.render(
            "queue.html",
            session=session,
            rows=shown,
            more=len(rows) - len(shown),
            filters={"policy": policy, "reviewer_role": role, "severity": severity, "status": status},
            options={
                "policy": sorted(policies | ({policy} if policy else set())),
                "reviewer_role": sorted(r for r in roles if r),
                "severity": sorted(s for s in severities if s),
                "status": QUEUE_STATUSES,
            },
        )

    async def decision(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        p = session.principal
        decision_id = request.path_params["decision_id"]
        rec: AuditRecord = await self.records.get_decision(p.tenant, decision_id)
        open_items: list[ReviewRecord] = []
        if p.may_call(LIST_REVIEWS):
            # every open item of this decision, also those another reviewer role must resolve (the
            # page says so instead of offering a form); the queue lists only the principal's own
            items = await self.records.list_reviews(p.tenant, state=ReviewState.OPEN)
            open_items = [r for r in items if r.decision_id == decision_id]
        resolved = None
        resolved_id = request.query_params.get("resolved")
        if resolved_id and p.may_call(LIST_REVIEWS):
            try:
                resolved = await self.records.get_review(p.tenant, resolved_id, principal=p)
            except (NotFoundError, InvalidInputError):
                resolved = None
            if resolved is not None and resolved.decision_id != decision_id:
                resolved = None
        now = time.time()
        return self.render(
            "decision.html",
            session=session,
            d=rec,
            open_items=[
                (r, reviews.timing(r.kind, r.state, r.params, now), p.may_resolve(r.params.get(REVIEWER_ROLE_PARAM)))
                for r in open_items
            ],
            resolved=resolved,
            may_resolve=p.may_call(RESOLVE_REVIEW),
            resolutions=list(RESOLUTIONS),
        )

    async def resolve(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        p: Principal = session.principal
        state = RESOLUTIONS.get(form.get("state", ""))
        if state is None:
            raise Refused(400, "choose approve, reject or dismiss")
        review_id = request.path_params["review_id"]
        # the same service-layer check as ReviewService.ResolveReview: role, reviewer_role, tenant
        rec = await self.records.resolve_review(p.tenant, review_id, state, note=form.get("comment", ""), principal=p)
        log.info("console: %s resolved review %s as %s", p.describe(), rec.id, rec.state.value)
        target = f"/decisions/{quote(rec.decision_id, safe='')}?{urlencode({'resolved': rec.id})}"
        return RedirectResponse(target, status_code=303)

    async def audit(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        p = session.principal
        q = request.query_params
        decision_id = q.get("decision_id", "").strip()
        policy = q.get("policy", "").strip()
        since_text, until_text = q.get("since", ""), q.get("until", "")
        since = parse_time(since_text, "since")
        until = parse_time(until_text, "until")
        records: list[AuditRecord]
        if decision_id:
            p.require(GET_DECISION)
            try:
                found = await self.records.get_decision(p.tenant, decision_id)
            except NotFoundError:
                found = None
            records = [
                r
                for r in ([found] if found else [])
                if (not policy or r.policy == policy)
                and (since is None or r.created_at >= since)
                and (until is None or r.created_at <= until)
            ]
        else:
            records = await self.records.list_decisions(
                p.tenant, policy=policy, limit=self.limits.page_items, since=since, until=until
            )
        return self.render(
            "audit.html",
            session=session,
            records=records,
            filters={"decision_id": decision_id, "policy": policy, "since": since_text, "until": until_text},
            searched=bool(decision_id or policy or since is not None or until is not None),
            page_items=self.limits.page_items,
        )

    async def rollout_page(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        """A policy's shadow or canary candidate: the same report as ``policy shadow-report``,
        of the signed-in tenant's policies only (another tenant's name is simply not found)."""
        p = session.principal
        policy, environment = policy_filter(request)
        report = None
        if policy:
            if self.rollout is None:
                raise Refused(404, "this server keeps no shadow or canary candidates")
            report = await self.rollout.report(p.tenant, policy, environment)
        return self.render(
            "rollout.html", session=session, report=report, filters={"policy": policy, "environment": environment}
        )

    async def rules_page(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        """Each rule's measured precision from reviews and feedback (docs/calibration.md): of the
        labelled failures, the share people confirmed, with its count and 95% Wilson interval;
        "undefined" for a rule without a labelled failure. Verdicts and counts only, no text."""
        p = session.principal
        policy, environment = policy_filter(request)
        table = None
        if policy:
            if self.labels is None:
                raise Refused(404, "this server measures no rule precision")
            table = await self.labels.precision(p.tenant, policy=policy, environment=environment)
        return self.render(
            "rules.html",
            session=session,
            table=table,
            filters={"policy": policy, "environment": environment},
            max_labels=self.labels.limits.max_precision_labels if self.labels else 0,
        )
