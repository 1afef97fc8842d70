"""``Client`` (blocking) and ``AsyncClient`` (asyncio): the CrossAudit gRPC API from Python.

    from crossaudit import Client
    with Client("127.0.0.1:50051", api_key="...") as c:
        c.deploy_policy("policies/demo.yaml", environment="production")
        d = c.evaluate("Demo", prompt="hi", response="hello", timeout=2.0)
        print(d.decision_id, d.passed, d.action)

``evaluate`` returns the same shape as ``PolicyTester.evaluate`` (an
:class:`crossaudit.kernel.results.Decision`) plus ``decision_id``, ``policy_revision``,
``environment`` and ``review_ids``. Every failure is a typed
:class:`~crossaudit.kernel.errors.CrossAuditError` (an invalid policy is a
``PolicyValidationError`` with every issue), never a raw ``grpc.RpcError``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import grpc
from pydantic import Field

from crossaudit.kernel.errors import CrossAuditError, InvalidInputError, PolicyIssue, PolicyValidationError
from crossaudit.kernel.results import Decision
from crossaudit.orchestrator.policy.inline import Inlined, inline_local_code
from crossaudit.service import convert
from crossaudit.service.config import DEFAULT_ENVIRONMENT
from crossaudit.service.errors import from_item, from_rpc_error
from crossaudit.store.base import ReviewKind, ReviewState
from crossaudit.v1 import audit_pb2 as audit_pb
from crossaudit.v1 import audit_pb2_grpc as audit_grpc
from crossaudit.v1 import evaluation_pb2 as ev_pb
from crossaudit.v1 import evaluation_pb2_grpc as ev_grpc
from crossaudit.v1 import evaluator_pb2 as evr_pb
from crossaudit.v1 import evaluator_pb2_grpc as evr_grpc
from crossaudit.v1 import info_pb2 as info_pb
from crossaudit.v1 import info_pb2_grpc as info_grpc
from crossaudit.v1 import policy_pb2 as pol_pb
from crossaudit.v1 import policy_pb2_grpc as pol_grpc
from crossaudit.v1 import review_pb2 as rev_pb
from crossaudit.v1 import review_pb2_grpc as rev_grpc

DEFAULT_CALL_TIMEOUT_S = 30.0  # deadline of calls other than evaluate/upload when none is given
DEFAULT_UPLOAD_TIMEOUT_S = 1_800.0  # an upload may build an image
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
ProgressCallback = Callable[[str, float], None]
TlsOption: TypeAlias = bool | grpc.ChannelCredentials | str | os.PathLike[str]


class RemoteDecision(Decision):
    """A Decision answered by the service."""

    policy_revision: int = 0
    environment: str = ""
    review_ids: list[str] = Field(default_factory=list)
    request_id: str = ""


@dataclass(frozen=True)
class PolicyVersion:
    name: str
    version: int
    declared_version: str
    digest: str
    description: str
    created_at: float | None


@dataclass(frozen=True)
class Deployment:
    name: str
    environment: str
    version: int
    deployed_at: float | None


@dataclass(frozen=True)
class DeployResult:
    version: PolicyVersion
    deployment: Deployment
    created: bool  # False when identical content reused an existing version


@dataclass(frozen=True)
class PolicyInfo:
    version: PolicyVersion
    content: str
    deployments: tuple[Deployment, ...]


@dataclass(frozen=True)
class PolicySummary:
    name: str
    latest_version: int
    deployments: tuple[Deployment, ...]


@dataclass(frozen=True)
class RollbackResult:
    deployment: Deployment
    previous_version: int


@dataclass(frozen=True)
class EvaluatorInfo:
    id: str
    name: str
    version: int
    language: str
    dependencies: tuple[str, ...]
    digest: str
    created_at: float | None
    description: str = ""
    code: str = ""
    created: bool | None = None  # set by upload_evaluator


@dataclass(frozen=True)
class ReviewInfo:
    id: str
    decision_id: str
    policy: str
    policy_revision: int
    environment: str
    rule: str
    kind: ReviewKind
    state: ReviewState
    params: dict[str, Any]
    created_at: float | None
    resolved_at: float | None
    reviewer: str
    note: str
    escalated: bool = False  # an open flag past its escalate_at
    overdue: bool = False  # an open review past its review_due_at


@dataclass(frozen=True)
class AuditEntry:
    """One audit record: what decided, the outcome, per-rule results; hashes of the content."""

    decision_id: str
    policy: str
    policy_revision: int
    policy_version: str
    policy_digest: str
    environment: str
    passed: bool
    action: str
    rules: list[dict[str, Any]]
    errored_rules: list[str]
    latency_ms: float
    prompt_sha256: str
    response_sha256: str
    context_sha256: str
    modified_response_sha256: str
    created_at: float | None
    request_id: str
    prompt: str | None = None
    response: str | None = None


# --- conversions --------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerInfo:
    version: str
    tenant: str
    multi_tenant: bool
    sandbox_backend: str
    isolation: str
    weaker_isolation: bool


def _version(m: pol_pb.PolicyVersion) -> PolicyVersion:
    return PolicyVersion(
        m.name, m.version, m.declared_version, m.digest, m.description, convert.from_timestamp(m.created_at)
    )


def _deployment(m: pol_pb.Deployment) -> Deployment:
    return Deployment(m.name, m.environment, m.version, convert.from_timestamp(m.deployed_at))


def _evaluator(m: evr_pb.Evaluator, created: bool | None = None) -> EvaluatorInfo:
    return EvaluatorInfo(
        id=m.id,
        name=m.name,
        version=m.version,
        language=m.language,
        dependencies=tuple(m.dependencies),
        digest=m.digest,
        created_at=convert.from_timestamp(m.created_at),
        description=m.description,
        code=m.code,
        created=created,
    )


def _review(m: rev_pb.Review) -> ReviewInfo:
    return ReviewInfo(
        id=m.id,
        decision_id=m.decision_id,
        policy=m.policy,
        policy_revision=m.policy_revision,
        environment=m.environment,
        rule=m.rule,
        kind=convert.REVIEW_KIND_FROM_PB.get(m.kind, ReviewKind.FLAG),
        state=convert.REVIEW_STATE_FROM_PB.get(m.state, ReviewState.OPEN),
        params=convert.from_struct(m.params),
        created_at=convert.from_timestamp(m.created_at),
        resolved_at=convert.from_timestamp(m.resolved_at, m.HasField("resolved_at")),
        reviewer=m.reviewer,
        note=m.note,
        escalated=m.escalated,
        overdue=m.overdue,
    )


def _audit(m: audit_pb.DecisionRecord) -> AuditEntry:
    return AuditEntry(
        decision_id=m.decision_id,
        policy=m.policy,
        policy_revision=m.policy_revision,
        policy_version=m.policy_version,
        policy_digest=m.policy_digest,
        environment=m.environment,
        passed=m.passed,
        action=m.action,
        rules=[convert.from_struct(r) for r in m.rules],
        errored_rules=list(m.errored_rules),
        latency_ms=m.latency_ms,
        prompt_sha256=m.prompt_sha256,
        response_sha256=m.response_sha256,
        context_sha256=m.context_sha256,
        modified_response_sha256=m.modified_response_sha256,
        created_at=convert.from_timestamp(m.created_at),
        request_id=m.request_id,
        prompt=m.prompt if m.HasField("prompt") else None,
        response=m.response if m.HasField("response") else None,
    )


def decision_from_pb(m: ev_pb.EvaluateResponse) -> RemoteDecision:
    return RemoteDecision(**convert.decision_fields_from_pb(m))


POLICY_SUFFIXES = (".yaml", ".yml", ".json")


def _policy_source(path_or_text: str | os.PathLike[str]) -> tuple[str, str]:
    """(text, filename): a path is read; a string with a newline is the policy text itself."""
    text = path_or_text if isinstance(path_or_text, str) else None
    if text is not None and ("\n" in text or not (text.endswith(POLICY_SUFFIXES) or os.sep in text)):
        return text, ""
    p = Path(path_or_text)
    try:
        return p.read_text(encoding="utf-8"), str(p)
    except FileNotFoundError:
        raise InvalidInputError(f"policy file {p} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInputError(f"cannot read policy file {p}: {e}") from None


def _policy_upload(
    path_or_text: str | os.PathLike[str], base_dir: str | os.PathLike[str] | None
) -> tuple[str, str, Inlined]:
    """(text to send, filename, how it was inlined). The service never reads files a policy
    names, so ``code_file`` and ``evaluators/<name>.py`` are inlined here as ``config.code``:
    relative to the policy file, or for policy text to ``base_dir`` (without one, text is sent
    as is and the service refuses a ``code_file``)."""
    text, filename = _policy_source(path_or_text)
    base = Path(filename).parent if filename else base_dir
    if base is None:
        return text, filename, Inlined(text)
    inlined = inline_local_code(text, base, filename=filename or "<policy>")
    return inlined.text, filename, inlined


def _state(state: ReviewState | str | None) -> Any:  # a review_pb2.ReviewState value
    if state is None or state in ("", "any"):
        return rev_pb.REVIEW_STATE_UNSPECIFIED
    try:
        return convert.REVIEW_STATE_TO_PB[ReviewState(state)]
    except ValueError:
        raise InvalidInputError(
            f"invalid review state {state!r}: use {', '.join(s.value for s in ReviewState)}"
        ) from None


def _evaluate_request(
    policy: str,
    prompt: str,
    response: str,
    context: Mapping[str, Any] | None,
    environment: str,
    request_id: str = "",
) -> ev_pb.EvaluateRequest:
    req = ev_pb.EvaluateRequest(
        policy=policy, environment=environment, prompt=prompt, response=response, request_id=request_id
    )
    # CopyFrom, not the constructor (which re-parses): a context too deep to parse is the
    # server's to refuse, typed (INVALID_ARGUMENT naming max_struct_depth)
    req.context.CopyFrom(convert.to_struct(dict(context or {})))
    return req


def _credentials(tls: TlsOption) -> grpc.ChannelCredentials | None:
    if tls is False or tls is None:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    try:
        return grpc.ssl_channel_credentials(root_certificates=Path(tls).read_bytes())
    except OSError as e:
        raise InvalidInputError(f"cannot read CA certificate {tls}: {e.strerror}") from None


def _metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


# --- blocking client ----------------------------------------------------------------------


class Client:
    """Blocking client. ``tls``: False (plaintext), True (system roots), a CA file path, or
    ``grpc.ChannelCredentials``. ``timeout`` is the default deadline of management calls."""

    def __init__(
        self,
        target: str,
        api_key: str | None = None,
        tls: TlsOption = False,
        *,
        timeout: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        creds = _credentials(tls)
        self.target = target
        self.timeout = timeout
        self._md = _metadata(api_key)
        if creds is None:
            self._channel = grpc.insecure_channel(target, options=_OPTIONS)
        else:
            self._channel = grpc.secure_channel(target, creds, options=_OPTIONS)
        self._policies = pol_grpc.PolicyServiceStub(self._channel)
        self._evaluation = ev_grpc.EvaluationServiceStub(self._channel)
        self._evaluators = evr_grpc.EvaluatorServiceStub(self._channel)
        self._reviews = rev_grpc.ReviewServiceStub(self._channel)
        self._audit = audit_grpc.AuditServiceStub(self._channel)
        self._info = info_grpc.InfoServiceStub(self._channel)

    def _call(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        try:
            return method(request, timeout=timeout or self.timeout, metadata=self._md)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    # policies
    def validate_policy(
        self, path_or_text: str | os.PathLike[str], *, base_dir: str | os.PathLike[str] | None = None
    ) -> list[PolicyIssue]:
        """Every issue the server finds (empty: valid), after inlining local files (as deploy)."""
        try:
            text, filename, inlined = _policy_upload(path_or_text, base_dir)
        except PolicyValidationError as e:  # a local file it names cannot be read
            return e.issues
        r = self._call(self._policies.ValidatePolicy, pol_pb.ValidatePolicyRequest(content=text, filename=filename))
        return inlined.relocate(PolicyValidationError([convert.issue_from_pb(i) for i in r.issues])).issues

    def deploy_policy(
        self,
        path_or_text: str | os.PathLike[str],
        environment: str = DEFAULT_ENVIRONMENT,
        *,
        base_dir: str | os.PathLike[str] | None = None,
    ) -> DeployResult:
        """Deploy a policy file (or text). ``code_file`` and ``evaluators/<name>.py`` are read here,
        next to the policy file (or in ``base_dir`` for text), and sent inline as ``config.code``."""
        text, filename, inlined = _policy_upload(path_or_text, base_dir)
        req = pol_pb.DeployPolicyRequest(content=text, environment=environment, filename=filename)
        try:
            r = self._call(self._policies.DeployPolicy, req)
        except PolicyValidationError as e:  # lines of the author's file, not of the inlined text
            raise inlined.relocate(e, filename) from None
        return DeployResult(_version(r.version), _deployment(r.deployment), r.created)

    def get_policy(self, name: str, environment: str = DEFAULT_ENVIRONMENT, version: int = 0) -> PolicyInfo:
        r = self._call(
            self._policies.GetPolicy, pol_pb.GetPolicyRequest(name=name, environment=environment, version=version)
        )
        return PolicyInfo(_version(r.version), r.content, tuple(_deployment(d) for d in r.deployments))

    def list_policies(self, environment: str = "") -> list[PolicySummary]:
        r = self._call(self._policies.ListPolicies, pol_pb.ListPoliciesRequest(environment=environment))
        return [
            PolicySummary(p.name, p.latest_version, tuple(_deployment(d) for d in p.deployments)) for p in r.policies
        ]

    def rollback(self, name: str, environment: str = DEFAULT_ENVIRONMENT, to_version: int = 0) -> RollbackResult:
        req = pol_pb.RollbackPolicyRequest(name=name, environment=environment, to_version=to_version)
        r = self._call(self._policies.RollbackPolicy, req)
        return RollbackResult(_deployment(r.deployment), r.previous_version)

    # evaluation
    def evaluate(
        self,
        policy: str,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None = None,
        environment: str = DEFAULT_ENVIRONMENT,
        timeout: float | None = None,
    ) -> RemoteDecision:
        """``timeout`` (seconds) is the call's deadline: the server's evaluators get what is left."""
        req = _evaluate_request(policy, prompt, response, context, environment)
        return decision_from_pb(self._call(self._evaluation.Evaluate, req, timeout))

    def evaluate_many(
        self,
        policy: str,
        items: Iterable[Mapping[str, Any]],
        environment: str = DEFAULT_ENVIRONMENT,
        timeout: float | None = None,
    ) -> Iterator[RemoteDecision | CrossAuditError]:
        """Evaluate many ``{"prompt", "response", "context"?, "request_id"?}`` over one stream.
        Answers come as they are ready; match them by ``request_id`` (default: the index)."""
        requests = (
            _evaluate_request(
                policy,
                it.get("prompt", ""),
                it.get("response", ""),
                it.get("context"),
                environment,
                str(it.get("request_id", i)),
            )
            for i, it in enumerate(items)
        )
        try:
            for r in self._evaluation.EvaluateStream(requests, timeout=timeout, metadata=self._md):
                if r.HasField("decision"):
                    yield decision_from_pb(r.decision)
                else:
                    yield _item_error(r.error, r.request_id)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def submit_feedback(self, decision_id: str, label: str, rule: str = "", comment: str = "") -> str:
        req = ev_pb.SubmitFeedbackRequest(decision_id=decision_id, rule=rule, label=label, comment=comment)
        return self._call(self._evaluation.SubmitFeedback, req).feedback_id

    # evaluators
    def upload_evaluator(
        self,
        name: str,
        code: str,
        dependencies: Iterable[str] = (),
        progress: ProgressCallback | None = None,
        *,
        language: str = "python",
        description: str = "",
        timeout: float = DEFAULT_UPLOAD_TIMEOUT_S,
    ) -> EvaluatorInfo:
        """Validate, prepare (image build progress → ``progress(message, fraction)``) and store."""
        req = evr_pb.UploadEvaluatorRequest(
            name=name, code=code, language=language, dependencies=list(dependencies), description=description
        )
        result: EvaluatorInfo | None = None
        try:
            for event in self._evaluators.UploadEvaluator(req, timeout=timeout, metadata=self._md):
                if event.HasField("progress"):
                    if progress is not None:
                        progress(event.progress.message, event.progress.fraction)
                elif event.HasField("evaluator"):
                    result = _evaluator(event.evaluator, event.created)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        if result is None:
            raise CrossAuditError("the server ended the upload without an answer")
        return result

    def get_evaluator(
        self, evaluator_id: str = "", *, name: str = "", version: int = 0, include_code: bool = False
    ) -> EvaluatorInfo:
        req = evr_pb.GetEvaluatorRequest(id=evaluator_id, name=name, version=version, include_code=include_code)
        return _evaluator(self._call(self._evaluators.GetEvaluator, req))

    def list_evaluators(self, name: str = "") -> list[EvaluatorInfo]:
        r = self._call(self._evaluators.ListEvaluators, evr_pb.ListEvaluatorsRequest(name=name))
        return [_evaluator(e) for e in r.evaluators]

    # reviews
    def list_reviews(
        self, state: ReviewState | str | None = None, policy: str = "", limit: int = 0
    ) -> list[ReviewInfo]:
        req = rev_pb.ListReviewsRequest(state=_state(state), policy=policy, limit=limit)
        return [_review(r) for r in self._call(self._reviews.ListReviews, req).reviews]

    def resolve_review(
        self, review_id: str, state: ReviewState | str, reviewer: str = "", note: str = ""
    ) -> ReviewInfo:
        req = rev_pb.ResolveReviewRequest(id=review_id, state=_state(state), reviewer=reviewer, note=note)
        return _review(self._call(self._reviews.ResolveReview, req))

    # info
    def server_info(self) -> ServerInfo:
        """The server's version and where custom code runs (``weaker_isolation`` for the process sandbox)."""
        m = self._call(self._info.GetServerInfo, info_pb.GetServerInfoRequest())
        return ServerInfo(
            version=m.version,
            tenant=m.tenant,
            multi_tenant=m.multi_tenant,
            sandbox_backend=m.sandbox_backend,
            isolation=m.isolation,
            weaker_isolation=m.weaker_isolation,
        )

    # audit
    def get_decision(self, decision_id: str) -> AuditEntry:
        """The audit record of an answered decision."""
        return _audit(self._call(self._audit.GetDecision, audit_pb.GetDecisionRequest(decision_id=decision_id)))

    def list_decisions(self, policy: str = "", limit: int = 0) -> list[AuditEntry]:
        """Audit records, most recent first (``limit`` 0 = the server's cap)."""
        r = self._call(self._audit.ListDecisions, audit_pb.ListDecisionsRequest(policy=policy, limit=limit))
        return [_audit(d) for d in r.decisions]

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _item_error(err: ev_pb.ItemError, request_id: str) -> CrossAuditError:
    """A stream item's error, rebuilt by the one codec (class, retryable flag, wire fields)."""
    exc = from_item(err.code, err.message, err.retryable, err.error_type, err.detail)
    exc.request_id = request_id  # type: ignore[attr-defined]
    return exc


# --- asyncio client -----------------------------------------------------------------------


class AsyncClient:
    """The asyncio twin of :class:`Client` (grpc.aio); use ``async with``."""

    def __init__(
        self,
        target: str,
        api_key: str | None = None,
        tls: TlsOption = False,
        *,
        timeout: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        creds = _credentials(tls)
        self.target = target
        self.timeout = timeout
        self._md = _metadata(api_key)
        if creds is None:
            self._channel = grpc.aio.insecure_channel(target, options=_OPTIONS)
        else:
            self._channel = grpc.aio.secure_channel(target, creds, options=_OPTIONS)
        self._policies = pol_grpc.PolicyServiceStub(self._channel)
        self._evaluation = ev_grpc.EvaluationServiceStub(self._channel)
        self._evaluators = evr_grpc.EvaluatorServiceStub(self._channel)
        self._reviews = rev_grpc.ReviewServiceStub(self._channel)

    async def _call(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        try:
            return await method(request, timeout=timeout or self.timeout, metadata=self._md)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    async def deploy_policy(
        self,
        path_or_text: str | os.PathLike[str],
        environment: str = DEFAULT_ENVIRONMENT,
        *,
        base_dir: str | os.PathLike[str] | None = None,
    ) -> DeployResult:
        """As :meth:`Client.deploy_policy` (local files inlined)."""
        text, filename, inlined = _policy_upload(path_or_text, base_dir)
        req = pol_pb.DeployPolicyRequest(content=text, environment=environment, filename=filename)
        try:
            r = await self._call(self._policies.DeployPolicy, req)
        except PolicyValidationError as e:
            raise inlined.relocate(e, filename) from None
        return DeployResult(_version(r.version), _deployment(r.deployment), r.created)

    async def evaluate(
        self,
        policy: str,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None = None,
        environment: str = DEFAULT_ENVIRONMENT,
        timeout: float | None = None,
    ) -> RemoteDecision:
        req = _evaluate_request(policy, prompt, response, context, environment)
        return decision_from_pb(await self._call(self._evaluation.Evaluate, req, timeout))

    async def evaluate_many(
        self,
        policy: str,
        items: Iterable[Mapping[str, Any]],
        environment: str = DEFAULT_ENVIRONMENT,
        timeout: float | None = None,
    ) -> AsyncIterator[RemoteDecision | CrossAuditError]:
        requests = [
            _evaluate_request(
                policy,
                it.get("prompt", ""),
                it.get("response", ""),
                it.get("context"),
                environment,
                str(it.get("request_id", i)),
            )
            for i, it in enumerate(items)
        ]
        try:
            async for r in self._evaluation.EvaluateStream(iter(requests), timeout=timeout, metadata=self._md):
                yield decision_from_pb(r.decision) if r.HasField("decision") else _item_error(r.error, r.request_id)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    async def list_reviews(
        self, state: ReviewState | str | None = None, policy: str = "", limit: int = 0
    ) -> list[ReviewInfo]:
        req = rev_pb.ListReviewsRequest(state=_state(state), policy=policy, limit=limit)
        return [_review(r) for r in (await self._call(self._reviews.ListReviews, req)).reviews]

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
