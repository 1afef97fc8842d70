"""Who calls: an API key's :class:`Principal` (tenant, role, name, reviewer roles) and the ONE
table of what each role may do.

Roles (``keys:`` items of the API-keys file, see :mod:`crossaudit.service.auth`):

========  ==================================================================================
admin     everything (a plain-string key is an admin: files written before roles keep working)
service   an application: Evaluate, EvaluateStream, SubmitFeedback, ValidatePolicy, GetPolicy,
          ListPolicies, GetServerInfo — no deploy/rollback, no uploads, no reviews, no audit log
reviewer  a person working the review queue: ListReviews, ResolveReview, GetDecision,
          ListDecisions, GetServerInfo; resolves only items whose ``reviewer_role`` is one of
          its ``reviewer_roles`` (or items without one)
========  ==================================================================================

Methods are gRPC full names (``/crossaudit.v1.ReviewService/ResolveReview``). A method that is
not listed for a role is denied to it — so a service added later (``DeliveryService``, ...) is
admin-only until someone lists it here. The web console (:mod:`crossaudit.console`)
asks the same table, with the RPC that each page stands for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from crossaudit.kernel.errors import ConfigurationError, PermissionDeniedError

API_PACKAGE = "crossaudit.v1"
# Reviewer names and reviewer roles: short identifiers that end up in the audit trail.
PRINCIPAL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")
REVIEWER_ROLE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
MAX_REVIEWER_ROLES = 64  # reviewer_roles one key may carry
REVIEWER_ROLE_PARAM = "reviewer_role"  # where a review item's params name the role that may resolve it


class Role(StrEnum):
    ADMIN = "admin"
    REVIEWER = "reviewer"
    SERVICE = "service"
    AUDITOR = "auditor"  # reads the audit log, its proofs, receipts and labels; changes nothing


def rpc(service: str, method: str) -> str:
    """The gRPC full method name (what an interceptor sees)."""
    return f"/{API_PACKAGE}.{service}/{method}"


EVALUATE = rpc("EvaluationService", "Evaluate")
EVALUATE_STREAM = rpc("EvaluationService", "EvaluateStream")
SUBMIT_FEEDBACK = rpc("EvaluationService", "SubmitFeedback")
VALIDATE_POLICY = rpc("PolicyService", "ValidatePolicy")
GET_POLICY = rpc("PolicyService", "GetPolicy")
LIST_POLICIES = rpc("PolicyService", "ListPolicies")
GET_SERVER_INFO = rpc("InfoService", "GetServerInfo")
LIST_REVIEWS = rpc("ReviewService", "ListReviews")
RESOLVE_REVIEW = rpc("ReviewService", "ResolveReview")
GET_DECISION = rpc("AuditService", "GetDecision")
LIST_DECISIONS = rpc("AuditService", "ListDecisions")
# Admin only (listed for no role below), as DeployPolicy: it reads the tenant's retained text.
REPLAY = rpc("ReplayService", "Replay")
SHADOW_REPORT = rpc("PolicyService", "ShadowReport")
# The decision log (docs/evidence.md): an auditor's whole job, a reviewer's receipts.
GET_RECEIPT = rpc("AuditService", "GetReceipt")
# Labels from production (docs/calibration.md): an admin's and an auditor's (it reads retained text).
LIST_LABELS = rpc("AuditService", "ListLabels")
LOG_METHODS = frozenset(
    {
        rpc("AuditService", "GetLogKey"),
        rpc("AuditService", "ReadLog"),
        rpc("AuditService", "GetInclusionProof"),
        rpc("AuditService", "GetConsistencyProof"),
        GET_RECEIPT,
    }
)  # admin-only (not listed below); the console checks it

ALL_METHODS = "*"
# THE permission table: the methods each role may call (deny unless listed).
PERMISSIONS: Mapping[Role, frozenset[str]] = {
    Role.ADMIN: frozenset({ALL_METHODS}),
    Role.SERVICE: frozenset(
        {EVALUATE, EVALUATE_STREAM, SUBMIT_FEEDBACK, VALIDATE_POLICY, GET_POLICY, LIST_POLICIES, GET_SERVER_INFO}
    ),
    Role.REVIEWER: frozenset(
        {LIST_REVIEWS, RESOLVE_REVIEW, GET_DECISION, LIST_DECISIONS, GET_SERVER_INFO, GET_RECEIPT}
    ),
    Role.AUDITOR: frozenset({GET_DECISION, LIST_DECISIONS, GET_SERVER_INFO, LIST_LABELS, *LOG_METHODS}),
}
# Roles that may sign in to the review console (a service key is an application's, not a person's).
CONSOLE_ROLES = frozenset({Role.ADMIN, Role.REVIEWER})


def allowed(role: Role, method: str) -> bool:
    granted = PERMISSIONS.get(role, frozenset())
    return ALL_METHODS in granted or method in granted


def short_method(method: str) -> str:
    """``/crossaudit.v1.ReviewService/ResolveReview`` → ``ReviewService.ResolveReview``."""
    service, _, name = method.lstrip("/").rpartition("/")
    return f"{service.rsplit('.', 1)[-1]}.{name}" if service else name


@dataclass(frozen=True)
class Principal:
    """The caller behind an API key (or a console session)."""

    tenant: str
    role: Role = Role.ADMIN
    name: str = ""
    reviewer_roles: frozenset[str] = field(default_factory=frozenset)

    def describe(self) -> str:
        """For messages: role and name, never the key."""
        return f"{self.role.value} {self.name!r}" if self.name else f"{self.role.value} key"

    def may_call(self, method: str) -> bool:
        return allowed(self.role, method)

    def require(self, method: str) -> None:
        if not self.may_call(method):
            raise PermissionDeniedError(
                f"role {self.role.value!r} may not call {short_method(method)} (roles: docs/review-console.md)"
            )

    def may_resolve(self, reviewer_role: Any) -> bool:
        """May this principal resolve an item that asks for ``reviewer_role`` (None: any reviewer)?"""
        if self.role is Role.ADMIN:
            return True
        if not self.may_call(RESOLVE_REVIEW):
            return False
        return not reviewer_role or str(reviewer_role) in self.reviewer_roles

    def require_resolve(self, review_id: str, reviewer_role: Any) -> None:
        self.require(RESOLVE_REVIEW)
        if not self.may_resolve(reviewer_role):
            mine = ", ".join(sorted(self.reviewer_roles)) or "none"
            raise PermissionDeniedError(
                f"review {review_id!r} needs reviewer_role {reviewer_role!r}; {self.describe()} has "
                f"reviewer_roles: {mine}"
            )

    def sees(self, params: Mapping[str, Any]) -> bool:
        """Whether a review item belongs in this principal's queue (reviewers: the items they may
        resolve; admins: all)."""
        return self.may_resolve(params.get(REVIEWER_ROLE_PARAM))

    def reviewer_identity(self, requested: str = "") -> str:
        """Who is recorded as the resolver: the principal's name when it has one, else what the
        request says (admin keys without a name, and files written before roles)."""
        return self.name or requested


def admin(tenant: str) -> Principal:
    return Principal(tenant, Role.ADMIN)


def parse_role(value: Any, where: str) -> Role:
    try:
        return Role(value)
    except ValueError:
        roles = ", ".join(r.value for r in Role)
        raise ConfigurationError(f"{where}: role must be one of {roles}") from None  # the value: never echoed


def parse_reviewer_roles(value: Any, where: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
        raise ConfigurationError(f"{where}: reviewer_roles must be a list of role names")
    if len(value) > MAX_REVIEWER_ROLES:
        raise ConfigurationError(f"{where}: more than {MAX_REVIEWER_ROLES} reviewer_roles")
    for r in value:
        if not REVIEWER_ROLE.match(r):
            raise ConfigurationError(f"{where}: a reviewer role must be 1-64 letters, digits, '_', '.', ':' or '-'")
    return frozenset(value)


def roles_table() -> Iterable[tuple[Role, list[str]]]:
    """(role, sorted short method names) for docs and the console's help."""
    for role, methods in PERMISSIONS.items():
        yield role, sorted(short_method(m) if m != ALL_METHODS else "everything" for m in methods)
