"""``Client`` (blocking) and ``AsyncClient`` (asyncio): the CrossAudit gRPC API from Python.

    from crossaudit import Client
    with Client("127.0.0.1:50051", api_key="...") as c:
        c.deploy_policy("policies/demo_offline.yaml", environment="production")
        d = c.evaluate("Offline Demo", prompt="hi", response="hello", timeout=2.0)
        print(d.decision_id, d.passed, d.action)

Both clients have the same methods. :class:`ClientBase` builds every request and says how its
answer is read (the one codec, ``crossaudit.api.convert``), so each client is only its
transport: blocking stubs, or ``grpc.aio`` awaited. Answers are the store's records (their
``tenant`` is empty: the API key decides it) or models derived from them, all re-exported by
``crossaudit.sdk``.

``evaluate`` returns the same shape as ``PolicyTester.evaluate`` (an
:class:`crossaudit.kernel.results.Decision`) plus ``decision_id``, ``policy_revision``,
``environment`` and ``review_ids``. Every failure is a typed
:class:`~crossaudit.kernel.errors.CrossAuditError` (an invalid policy is a
``PolicyValidationError`` with every issue), never a raw ``grpc.RpcError``: a server that does
not answer is a ``ServerUnavailableError`` saying what to check, and a request over
``max_request_bytes`` is a ``RequestTooLargeError`` raised before anything is sent.
"""

from __future__ import annotations

import abc
import json
import os
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import grpc

from crossaudit.api import convert
from crossaudit.api.errors import from_rpc_error
from crossaudit.api.limits import DEFAULT_ENVIRONMENT
from crossaudit.api.models import (
    DeployResult,
    LabelPage,
    PolicyInfo,
    PromoteResult,
    RemoteDecision,
    ReviewInfo,
    RollbackResult,
    ServerInfo,
    ShadowReport,
    UploadedEvaluator,
)
from crossaudit.api.records import (
    AuditRecord,
    CandidateRecord,
    ErasureRecord,
    EvaluatorRecord,
    OutboxRecord,
    OutboxState,
    PolicySummaryRecord,
)
from crossaudit.api.replayreport import ReplayProgress, ReplayReport
from crossaudit.evidence.export import Exporter, export_chunks
from crossaudit.evidence.notes import PublicKey, load_public_key
from crossaudit.evidence.proofs import ConsistencyProof, InclusionProof, LogKeyInfo
from crossaudit.evidence.verify import ChunkVerifier, LogChunk, Report
from crossaudit.kernel import tracing
from crossaudit.kernel.errors import (
    ConfigurationError,
    CrossAuditError,
    InvalidInputError,
    PolicyIssue,
    PolicyValidationError,
    ServerUnavailableError,
)
from crossaudit.kernel.progress import ProgressCallback
from crossaudit.sdk.options import (
    API_KEY_ENV,
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_SERVER,
    DEFAULT_UPLOAD_TIMEOUT_S,
    SERVER_ENV,
    Target,
    TlsOption,
    call_metadata,
    channel_target,
    credentials,
    request_limit,
    request_too_large,
    send_options,
    unreachable,
)
from crossaudit.sdk.sources import policy_upload
from crossaudit.v1 import audit_pb2 as audit_pb
from crossaudit.v1 import audit_pb2_grpc as audit_grpc
from crossaudit.v1 import delivery_pb2 as dlv_pb
from crossaudit.v1 import delivery_pb2_grpc as dlv_grpc
from crossaudit.v1 import evaluation_pb2 as ev_pb
from crossaudit.v1 import evaluation_pb2_grpc as ev_grpc
from crossaudit.v1 import evaluator_pb2 as evr_pb
from crossaudit.v1 import evaluator_pb2_grpc as evr_grpc
from crossaudit.v1 import info_pb2 as info_pb
from crossaudit.v1 import info_pb2_grpc as info_grpc
from crossaudit.v1 import policy_pb2 as pol_pb
from crossaudit.v1 import policy_pb2_grpc as pol_grpc
from crossaudit.v1 import replay_pb2 as rpl_pb
from crossaudit.v1 import replay_pb2_grpc as rpl_grpc
from crossaudit.v1 import review_pb2 as rev_pb
from crossaudit.v1 import review_pb2_grpc as rev_grpc
from orchestrator.reviews import ReviewState

T = TypeVar("T")
PathOrText = str | os.PathLike[str]


def _unchanged(error: CrossAuditError) -> CrossAuditError:
    return error


@dataclass(frozen=True)
class Unary(Generic[T]):
    """One unary call as data: the stub method, its request, and how its answer is read."""

    method: Callable[..., Any] | None  # None: answered here, without a call (see answered)
    request: Any
    decode: Callable[[Any], T]
    timeout: float | None = None  # None: the client's default deadline
    failed: Callable[[CrossAuditError], CrossAuditError] = _unchanged  # the error the caller sees

    @classmethod
    def answered(cls, answer: T) -> Unary[T]:
        return cls(None, None, lambda _: answer)


@dataclass(frozen=True)
class Stream(Generic[T]):
    """A call answered by a stream, each message read by ``decode``. ``request`` is a message,
    or an iterator of them (a bidirectional stream); ``timeout`` None means no deadline."""

    method: Callable[..., Any]
    request: Any
    decode: Callable[[Any], T]
    timeout: float | None = None
    failed: Callable[[CrossAuditError], CrossAuditError] = _unchanged  # the error the caller sees


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
    stage: str = "",
    provisional: bool = False,
) -> ev_pb.EvaluateRequest:
    req = ev_pb.EvaluateRequest(
        policy=policy,
        environment=environment,
        prompt=_utf8(prompt, "the prompt"),
        response=_utf8(response, "the response"),
        request_id=request_id,
        stage=stage,
        provisional=provisional,
    )
    # CopyFrom, not the constructor (which re-parses): a context too deep to parse is the
    # server's to refuse, typed (INVALID_ARGUMENT naming max_struct_depth)
    req.context.CopyFrom(convert.to_struct(dict(context or {})))
    return req


def _utf8(text: str, what: str) -> str:
    """``text`` when the wire (UTF-8) can carry it, else InvalidInputError before anything is sent
    (a lone surrogate a model wrote: protobuf would raise a bare UnicodeEncodeError)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        raise InvalidInputError(f"{what} is not UTF-8 text: it holds a lone surrogate") from None
    return text


def _tool_request(name: str, call_id: str, context: Mapping[str, Any] | None) -> dict[str, Any]:
    """The context of a tool stage's evaluation: the caller's, with ``tool.name`` and ``tool.call_id``."""
    if not isinstance(name, str) or not name:
        raise InvalidInputError("a tool's name is a non-empty string")
    _utf8(name, "a tool's name")
    _utf8(call_id, "a tool call's id")
    ctx = dict(context or {})
    given = ctx.get("tool")
    tool = {k: v for k, v in given.items() if k != "arguments"} if isinstance(given, Mapping) else {}
    tool["name"] = name
    if call_id:
        tool["call_id"] = call_id
    ctx["tool"] = tool
    return ctx


def _arguments_text(arguments: str | Mapping[str, Any] | Sequence[Any]) -> str:
    """A tool call's arguments as the text evaluated: a string as the model sent it (the server
    refuses one that is not JSON), else the value as JSON."""
    if isinstance(arguments, str):
        return _utf8(arguments, "a tool call's arguments")
    try:
        text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"a tool call's arguments must be JSON: {str(e)[:120]}") from None
    return _utf8(text, "a tool call's arguments")


@dataclass(frozen=True)
class ReplayOptions:
    """What :meth:`Client.replay_policy` replays: the range (epoch seconds, inclusive), at most
    ``limit`` records (0: the server's cap), whether LLM judges are called again, how many
    sample ids per category, or only the estimate of those calls."""

    environment: str = DEFAULT_ENVIRONMENT
    since: float | None = None
    until: float | None = None
    limit: int = 0
    rerun_llm: bool = False
    samples: int = 0
    estimate_only: bool = False


class ClientBase(abc.ABC):
    """What both clients share: the stubs, and for each method the call it makes (request and
    decoding). A subclass opens its channel and runs :class:`Unary` and :class:`Stream` calls."""

    def __init__(
        self,
        target: Target | None = None,
        api_key: str | None = None,
        tls: TlsOption = False,
        *,
        timeout: float = DEFAULT_CALL_TIMEOUT_S,
        max_request_bytes: int | None = None,
    ) -> None:
        """``tls``: False (plaintext), True (system roots), a CA file path, or
        ``grpc.ChannelCredentials``. ``timeout`` is the default deadline of management calls.
        ``target``: one ``host:port``; several replicas as a list or ``"h1:p1,h2:p2"`` (IP addresses);
        or one DNS name resolving to every replica: calls are spread with gRPC's client-side
        ``round_robin`` (``crossaudit.sdk.options.channel_target``). Without one: ``$CROSSAUDIT_SERVER``,
        else 127.0.0.1:50051. ``api_key`` defaults to ``$CROSSAUDIT_API_KEY``.
        ``max_request_bytes``: a larger request raises ``RequestTooLargeError`` before it is sent
        (default ``$CROSSAUDIT_LIMITS__MAX_REQUEST_BYTES``, else the server's default, 4 MiB);
        raise it together with the server's ``limits.max_request_bytes``."""
        target = target or os.environ.get(SERVER_ENV) or DEFAULT_SERVER
        if api_key is None:
            api_key = os.environ.get(API_KEY_ENV) or None
        creds = credentials(tls)
        self.max_request_bytes = request_limit(max_request_bytes)
        self.target, options = channel_target(target)  # the gRPC target string
        self._options = [*options, *send_options(self.max_request_bytes)]
        self.address = target if isinstance(target, str) else ",".join(map(str, target))  # as given, for messages
        self.timeout = timeout
        self._md = call_metadata(api_key)
        self._channel = self._open(self.target, creds)
        self._policies = pol_grpc.PolicyServiceStub(self._channel)
        self._evaluation = ev_grpc.EvaluationServiceStub(self._channel)
        self._evaluators = evr_grpc.EvaluatorServiceStub(self._channel)
        self._reviews = rev_grpc.ReviewServiceStub(self._channel)
        self._audit = audit_grpc.AuditServiceStub(self._channel)
        self._info = info_grpc.InfoServiceStub(self._channel)
        self._deliveries = dlv_grpc.DeliveryServiceStub(self._channel)
        self._replays = rpl_grpc.ReplayServiceStub(self._channel)

    @abc.abstractmethod
    def _open(self, target: str, creds: grpc.ChannelCredentials | None) -> Any:
        """The channel the stubs use."""

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        """The call's metadata: the API key, and the current span's W3C trace context when the
        application traces with OpenTelemetry (the server's spans continue its trace); nothing
        more when no span is active."""
        trace_context = tracing.inject()
        return (*self._md, *trace_context) if trace_context else self._md

    def _sized(self, request: Any) -> Any:
        """``request``, when it is within ``max_request_bytes`` (else RequestTooLargeError): the
        server would refuse it anyway, after it crossed the network."""
        size = request.ByteSize()
        if size > self.max_request_bytes:
            raise request_too_large(size, self.max_request_bytes)
        return request

    def _error(self, e: grpc.RpcError) -> CrossAuditError:
        """The typed error of a failed call; a server that never answered is named with its address."""
        error = from_rpc_error(e)
        if type(error) is ServerUnavailableError:
            details = e.details() if callable(getattr(e, "details", None)) else ""
            return unreachable(self.address, details or "")
        return error

    # policies
    def _validate_policy(self, path_or_text: PathOrText, base_dir: PathOrText | None) -> Unary[list[PolicyIssue]]:
        try:
            text, filename, inlined = policy_upload(path_or_text, base_dir)
        except PolicyValidationError as e:  # a local file it names cannot be read
            return Unary.answered(e.issues)

        def decode(r: pol_pb.ValidatePolicyResponse) -> list[PolicyIssue]:
            return inlined.relocate(PolicyValidationError([convert.issue_from_pb(i) for i in r.issues])).issues

        req = pol_pb.ValidatePolicyRequest(content=text, filename=filename)
        return Unary(self._policies.ValidatePolicy, req, decode)

    def _deploy_policy(
        self,
        path_or_text: PathOrText,
        environment: str,
        base_dir: PathOrText | None,
        timeout: float,
        progress: ProgressCallback | None = None,
        candidate: pol_pb.CandidateOptions | None = None,
    ) -> Unary[DeployResult] | Stream[DeployResult | None]:
        """Without ``progress`` one unary call; with it DeployPolicyStream, whose progress events go
        to ``progress`` (decoded as None) and whose last event is the answer."""
        text, filename, inlined = policy_upload(path_or_text, base_dir)

        def failed(e: CrossAuditError) -> CrossAuditError:  # lines of the author's file, not of the inlined text
            return inlined.relocate(e, filename) if isinstance(e, PolicyValidationError) else e

        req = pol_pb.DeployPolicyRequest(content=text, environment=environment, filename=filename, candidate=candidate)
        if progress is None:
            return Unary(self._policies.DeployPolicy, req, convert.deploy_result_from_pb, timeout, failed)

        def decode(event: pol_pb.DeployPolicyEvent) -> DeployResult | None:
            if event.HasField("result"):
                return convert.deploy_result_from_pb(event.result)
            if event.HasField("progress"):
                progress(event.progress.message, event.progress.fraction)
            return None

        return Stream(self._policies.DeployPolicyStream, req, decode, timeout, failed)

    def _replay(
        self,
        path_or_text: PathOrText,
        against: str,
        options: ReplayOptions,
        base_dir: PathOrText | None,
        timeout: float | None,
        progress: Callable[[ReplayProgress], None] | None,
    ) -> Stream[ReplayReport | None]:
        text, filename, inlined = policy_upload(path_or_text, base_dir)

        def failed(e: CrossAuditError) -> CrossAuditError:  # lines of the author's file, not of the inlined text
            return inlined.relocate(e, filename) if isinstance(e, PolicyValidationError) else e

        req = rpl_pb.ReplayRequest(
            content=text,
            filename=filename,
            against=against,
            environment=options.environment,
            since=options.since,
            until=options.until,
            limit=options.limit,
            rerun_llm=options.rerun_llm,
            samples=options.samples,
            estimate_only=options.estimate_only,
        )

        def decode(event: rpl_pb.ReplayEvent) -> ReplayReport | None:
            if event.HasField("report"):
                return convert.replay_report_from_pb(event.report)
            if event.HasField("progress") and progress is not None:
                progress(convert.replay_progress_from_pb(event.progress))
            return None

        return Stream(self._replays.Replay, req, decode, timeout, failed)

    @staticmethod
    def _replayed(result: ReplayReport | None) -> ReplayReport:
        if result is None:
            raise CrossAuditError("the server ended the replay without a report")
        return result

    @staticmethod
    def _deployed(result: DeployResult | None) -> DeployResult:
        if result is None:
            raise CrossAuditError("the server ended the deploy without an answer")
        return result

    def _get_policy(self, name: str, environment: str, version: int) -> Unary[PolicyInfo]:
        req = pol_pb.GetPolicyRequest(name=name, environment=environment, version=version)
        return Unary(self._policies.GetPolicy, req, convert.policy_info_from_pb)

    def _list_policies(self, environment: str) -> Unary[list[PolicySummaryRecord]]:
        req = pol_pb.ListPoliciesRequest(environment=environment)
        return Unary(self._policies.ListPolicies, req, lambda r: [convert.summary_from_pb(p) for p in r.policies])

    def _rollback(self, name: str, environment: str, to_version: int) -> Unary[RollbackResult]:
        req = pol_pb.RollbackPolicyRequest(name=name, environment=environment, to_version=to_version)
        return Unary(self._policies.RollbackPolicy, req, convert.rollback_from_pb)

    @staticmethod
    def _candidate(
        shadow: float | None, canary: float | None, canary_key: str, notify: str
    ) -> pol_pb.CandidateOptions | None:
        """A deploy's candidate options: ``shadow`` (the sampled fraction) or ``canary`` (the share)."""
        if shadow is not None and canary is not None:
            raise InvalidInputError("a candidate is a shadow or a canary, not both")
        if shadow is not None:
            return pol_pb.CandidateOptions(mode="shadow", share=shadow, notify_url=notify)
        if canary is not None:
            return pol_pb.CandidateOptions(mode="canary", share=canary, canary_key=canary_key, notify_url=notify)
        if canary_key or notify:
            raise InvalidInputError("canary_key and notify are options of a canary (canary=SHARE)")
        return None

    def _promote(self, name: str, environment: str) -> Unary[PromoteResult]:
        req = pol_pb.PromotePolicyRequest(name=name, environment=environment)
        return Unary(self._policies.PromotePolicy, req, convert.promote_from_pb)

    def _discard(self, name: str, environment: str) -> Unary[CandidateRecord]:
        req = pol_pb.DiscardCandidateRequest(name=name, environment=environment)
        return Unary(self._policies.DiscardCandidate, req, lambda r: convert.candidate_from_pb(r.candidate))

    def _shadow_report(self, name: str, environment: str) -> Unary[ShadowReport]:
        req = pol_pb.ShadowReportRequest(name=name, environment=environment)
        return Unary(self._policies.ShadowReport, req, convert.shadow_report_from_pb)

    # evaluation
    def _evaluate(
        self,
        policy: str,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None,
        environment: str,
        timeout: float | None,
        stage: str = "",
        request_id: str = "",
        provisional: bool = False,
    ) -> Unary[RemoteDecision]:
        req = _evaluate_request(policy, prompt, response, context, environment, request_id, stage, provisional)
        return Unary(self._evaluation.Evaluate, req, convert.decision_from_pb, timeout)

    def _evaluate_many(
        self, policy: str, items: Iterable[Mapping[str, Any]], environment: str, timeout: float | None
    ) -> Stream[RemoteDecision | CrossAuditError]:
        requests = (
            _evaluate_request(
                policy,
                it.get("prompt", ""),
                it.get("response", ""),
                it.get("context"),
                environment,
                str(it.get("request_id", i)),
                str(it.get("stage", "")),
            )
            for i, it in enumerate(items)
        )
        return Stream(self._evaluation.EvaluateStream, requests, convert.stream_item_from_pb, timeout)

    def _submit_feedback(self, decision_id: str, label: str, rule: str, comment: str) -> Unary[str]:
        req = ev_pb.SubmitFeedbackRequest(decision_id=decision_id, rule=rule, label=label, comment=comment)
        return Unary(self._evaluation.SubmitFeedback, req, lambda r: r.feedback_id)

    # evaluators
    def _upload_evaluator(
        self,
        name: str,
        code: str,
        dependencies: Iterable[str],
        progress: ProgressCallback | None,
        language: str,
        description: str,
        timeout: float,
    ) -> Stream[UploadedEvaluator | None]:
        """Progress events go to ``progress`` (decoded as None); the last event is the answer."""
        req = evr_pb.UploadEvaluatorRequest(
            name=name, code=code, language=language, dependencies=list(dependencies), description=description
        )

        def decode(event: evr_pb.UploadEvaluatorEvent) -> UploadedEvaluator | None:
            if event.HasField("evaluator"):
                return convert.uploaded_from_pb(event)
            if event.HasField("progress") and progress is not None:
                progress(event.progress.message, event.progress.fraction)
            return None

        return Stream(self._evaluators.UploadEvaluator, req, decode, timeout)

    @staticmethod
    def _uploaded(result: UploadedEvaluator | None) -> UploadedEvaluator:
        if result is None:
            raise CrossAuditError("the server ended the upload without an answer")
        return result

    def _get_evaluator(self, evaluator_id: str, name: str, version: int, include_code: bool) -> Unary[EvaluatorRecord]:
        req = evr_pb.GetEvaluatorRequest(id=evaluator_id, name=name, version=version, include_code=include_code)
        return Unary(self._evaluators.GetEvaluator, req, convert.evaluator_from_pb)

    def _list_evaluators(self, name: str) -> Unary[list[EvaluatorRecord]]:
        req = evr_pb.ListEvaluatorsRequest(name=name)
        return Unary(
            self._evaluators.ListEvaluators, req, lambda r: [convert.evaluator_from_pb(e) for e in r.evaluators]
        )

    # reviews
    def _list_reviews(self, state: ReviewState | str | None, policy: str, limit: int) -> Unary[list[ReviewInfo]]:
        req = rev_pb.ListReviewsRequest(state=_state(state), policy=policy, limit=limit)
        return Unary(self._reviews.ListReviews, req, lambda r: [convert.review_from_pb(x) for x in r.reviews])

    def _resolve_review(self, review_id: str, state: ReviewState | str, reviewer: str, note: str) -> Unary[ReviewInfo]:
        req = rev_pb.ResolveReviewRequest(id=review_id, state=_state(state), reviewer=reviewer, note=note)
        return Unary(self._reviews.ResolveReview, req, convert.review_from_pb)

    # webhook deliveries
    def _list_deliveries(self, state: OutboxState | str | None, limit: int) -> Unary[list[OutboxRecord]]:
        st = OutboxState(state) if isinstance(state, str) and state else state
        req = dlv_pb.ListDeliveriesRequest(state=convert.DELIVERY_STATE_TO_PB[st] if st else 0, limit=limit)
        return Unary(
            self._deliveries.ListDeliveries, req, lambda r: [convert.delivery_from_pb(m) for m in r.deliveries]
        )

    def _redeliver(self, delivery_id: str) -> Unary[OutboxRecord]:
        req = dlv_pb.RedeliverDeliveryRequest(id=delivery_id)
        return Unary(self._deliveries.RedeliverDelivery, req, convert.delivery_from_pb)

    # info
    def _server_info(self) -> Unary[ServerInfo]:
        return Unary(self._info.GetServerInfo, info_pb.GetServerInfoRequest(), convert.server_info_from_pb)

    # audit
    def _get_decision(self, decision_id: str) -> Unary[AuditRecord]:
        req = audit_pb.GetDecisionRequest(decision_id=decision_id)
        return Unary(self._audit.GetDecision, req, convert.audit_from_pb)

    def _erase_inputs(self, decision_id: str, context_field: tuple[str, str] | None) -> Unary[ErasureRecord]:
        # the request carries one selector: both given must not quietly erase by the field alone
        if bool(decision_id) == (context_field is not None):
            raise InvalidInputError("erase needs a decision id or a context field (name, value), exactly one")
        if context_field is not None:
            name, value = context_field
            req = audit_pb.EraseInputsRequest(context_field=audit_pb.ContextField(name=name, value=value))
        else:
            req = audit_pb.EraseInputsRequest(decision_id=decision_id)
        return Unary(self._audit.EraseInputs, req, convert.erasure_from_pb)

    def _list_decisions(self, policy: str, limit: int) -> Unary[list[AuditRecord]]:
        req = audit_pb.ListDecisionsRequest(policy=policy, limit=limit)
        return Unary(self._audit.ListDecisions, req, lambda r: [convert.audit_from_pb(d) for d in r.decisions])

    def _list_labels(
        self, policy: str, environment: str, since: float | None, page_token: str, page_size: int
    ) -> Unary[LabelPage]:
        req = audit_pb.ListLabelsRequest(
            policy=policy, environment=environment, page_token=page_token, page_size=page_size
        )
        if since is not None:
            req.since.CopyFrom(convert.timestamp(since))
        return Unary(self._audit.ListLabels, req, convert.label_page_from_pb)

    # the decision log (docs/evidence.md)
    def _log_key(self) -> Unary[LogKeyInfo]:
        def decode(m: audit_pb.LogKey) -> LogKeyInfo:
            trusted = [load_public_key(v, "the server's trusted key") for v in m.trusted_vkeys]
            key = load_public_key(m.vkey, "the server's key") if m.vkey else None
            return LogKeyInfo(m.log, key, trusted, m.signing)

        return Unary(self._audit.GetLogKey, audit_pb.GetLogKeyRequest(), decode)

    def _read_log(
        self, since: float | None, until: float | None, outside: bool, details: bool = False
    ) -> Stream[LogChunk]:
        req = audit_pb.ReadLogRequest(outside=outside, details=details)
        if since is not None:
            req.since.CopyFrom(convert.timestamp(since))
        if until is not None:
            req.until.CopyFrom(convert.timestamp(until))
        return Stream(self._audit.ReadLog, req, convert.log_chunk_from_pb, None)

    def _inclusion_proof(self, decision_id: str) -> Unary[InclusionProof]:
        req = audit_pb.GetInclusionProofRequest(decision_id=decision_id)
        return Unary(self._audit.GetInclusionProof, req, convert.inclusion_from_pb)

    def _consistency_proof(self, old_size: int, new_size: int) -> Unary[ConsistencyProof]:
        req = audit_pb.GetConsistencyProofRequest(old_size=old_size, new_size=new_size)
        return Unary(self._audit.GetConsistencyProof, req, convert.consistency_from_pb)

    def _receipt(self, decision_id: str) -> Unary[dict[str, Any]]:
        req = audit_pb.GetReceiptRequest(decision_id=decision_id)
        return Unary(self._audit.GetReceipt, req, convert.receipt_from_pb)


# --- blocking client ----------------------------------------------------------------------


class Client(ClientBase):
    """Blocking client (``with Client(...) as c:`` closes it)."""

    def _open(self, target: str, creds: grpc.ChannelCredentials | None) -> grpc.Channel:
        if creds is None:
            return grpc.insecure_channel(target, options=self._options)
        return grpc.secure_channel(target, creds, options=self._options)

    def _unary(self, call: Unary[T]) -> T:
        if call.method is None:
            return call.decode(None)
        request = self._sized(call.request)
        try:
            answer = call.method(request, timeout=call.timeout or self.timeout, metadata=self._metadata())
        except grpc.RpcError as e:
            raise call.failed(self._error(e)) from None
        return call.decode(answer)

    def _stream(self, call: Stream[T]) -> Iterator[T]:
        # grpc reads a request iterator in a thread of its own, where an exception only cancels
        # the call: the first bad request's typed error is kept and raised instead
        failed: list[CrossAuditError] = []

        def checked(requests: Iterator[Any]) -> Iterator[Any]:
            try:
                for request in requests:
                    yield self._sized(request)
            except CrossAuditError as e:
                failed.append(e)
                raise

        request = checked(call.request) if isinstance(call.request, Iterator) else self._sized(call.request)
        try:
            for message in call.method(request, timeout=call.timeout, metadata=self._metadata()):
                yield call.decode(message)
        except grpc.RpcError as e:
            raise (failed[0] if failed else call.failed(self._error(e))) from None

    def _last(self, call: Stream[T | None]) -> T | None:
        last = None
        for item in self._stream(call):
            last = item if item is not None else last
        return last

    # policies
    def validate_policy(self, path_or_text: PathOrText, *, base_dir: PathOrText | None = None) -> list[PolicyIssue]:
        """Every issue the server finds (empty: valid), after inlining local files (as deploy)."""
        return self._unary(self._validate_policy(path_or_text, base_dir))

    def deploy_policy(
        self,
        path_or_text: PathOrText,
        environment: str = DEFAULT_ENVIRONMENT,
        *,
        base_dir: PathOrText | None = None,
        progress: ProgressCallback | None = None,
        timeout: float = DEFAULT_UPLOAD_TIMEOUT_S,
        shadow: float | None = None,
        canary: float | None = None,
        canary_key: str = "",
        notify: str = "",
    ) -> DeployResult:
        """Deploy a policy file (or text). ``code_file`` and ``evaluators/<name>.py`` are read here,
        next to the policy file (or in ``base_dir`` for text), and sent inline as ``config.code``.

        The server prepares the policy's custom evaluators before it answers, building their
        dependency images the first time (minutes), hence the upload's deadline; ``progress(message,
        fraction)`` hears each step (``"<evaluator>: <step>"``) as ``upload_evaluator``'s does.

        ``shadow=0.1`` or ``canary=0.05, canary_key="user_id"`` (``notify=URL``: where a canary's
        automatic rollback is announced): stored as a candidate, not made active (docs/rollout.md)."""
        options = self._candidate(shadow, canary, canary_key, notify)
        call = self._deploy_policy(path_or_text, environment, base_dir, timeout, progress, options)
        if isinstance(call, Unary):
            return self._unary(call)
        return self._deployed(self._last(call))

    def promote(self, name: str, environment: str = DEFAULT_ENVIRONMENT) -> PromoteResult:
        """Make the running shadow or canary candidate the active version."""
        return self._unary(self._promote(name, environment))

    def discard(self, name: str, environment: str = DEFAULT_ENVIRONMENT) -> CandidateRecord:
        """End the running shadow or canary candidate; the active version stays."""
        return self._unary(self._discard(name, environment))

    def shadow_report(self, name: str, environment: str = DEFAULT_ENVIRONMENT) -> ShadowReport:
        return self._unary(self._shadow_report(name, environment))

    def get_policy(self, name: str, environment: str = DEFAULT_ENVIRONMENT, version: int = 0) -> PolicyInfo:
        return self._unary(self._get_policy(name, environment, version))

    def replay_policy(
        self,
        path_or_text: PathOrText,
        against: str,
        options: ReplayOptions | None = None,
        *,
        base_dir: PathOrText | None = None,
        progress: Callable[[ReplayProgress], None] | None = None,
        timeout: float | None = None,
    ) -> ReplayReport:
        """What the candidate policy (a file or text, code inlined as deploy does) would have
        decided on the recorded, retained decisions of ``against`` (docs/replay.md). Nothing is
        deployed or written. ``progress`` hears each page; ``timeout`` None: no deadline."""
        call = self._replay(path_or_text, against, options or ReplayOptions(), base_dir, timeout, progress)
        return self._replayed(self._last(call))

    def list_policies(self, environment: str = "") -> list[PolicySummaryRecord]:
        return self._unary(self._list_policies(environment))

    def rollback(self, name: str, environment: str = DEFAULT_ENVIRONMENT, to_version: int = 0) -> RollbackResult:
        return self._unary(self._rollback(name, environment, to_version))

    # evaluation
    def evaluate(
        self,
        policy: str,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None = None,
        environment: str = DEFAULT_ENVIRONMENT,
        timeout: float | None = None,
        *,
        stage: str = "",
        request_id: str = "",
        provisional: bool = False,
    ) -> RemoteDecision:
        """``timeout`` (seconds) is the call's deadline: the server's evaluators get what is left.
        ``stage`` ("input" | "output" | "tool_call" | "tool_result") runs only that stage's rules
        (docs/proxy.md, docs/agents.md); ``request_id``
        is recorded with the decision in the audit log. ``provisional`` (output stage only): a
        window of a streamed answer, audited only when it blocks (docs/proxy.md#streaming)."""
        return self._unary(
            self._evaluate(policy, prompt, response, context, environment, timeout, stage, request_id, provisional)
        )

    def evaluate_tool_call(
        self,
        policy: str,
        name: str,
        arguments: str | Mapping[str, Any] | Sequence[Any],
        *,
        call_id: str = "",
        context: Mapping[str, Any] | None = None,
        prompt: str = "",
        environment: str = DEFAULT_ENVIRONMENT,
        timeout: float | None = None,
        request_id: str = "",
    ) -> RemoteDecision:
        """Judge one tool call the model wants to make with the policy's ``stage: tool_call`` rules
        (docs/agents.md). ``arguments``: the JSON text as the model sent it, or a value sent as
        JSON; ``prompt``: the conversation so far, for evaluators that read it. The decision names
        the call (``tool_name``, ``tool_call_id``); a redaction is ``modified_arguments`` (valid JSON)."""
        return self.evaluate(
            policy, prompt, _arguments_text(arguments), _tool_request(name, call_id, context), environment, timeout,
            stage="tool_call", request_id=request_id,
        )  # fmt: skip

    def evaluate_tool_result(
        self,
        policy: str,
        name: str,
        output: str,
        *,
        call_id: str = "",
        context: Mapping[str, Any] | None = None,
        environment: str = DEFAULT_ENVIRONMENT,
        timeout: float | None = None,
        request_id: str = "",
    ) -> RemoteDecision:
        """Judge a tool's output before the model reads it with the policy's ``stage: tool_result``
        rules (an indirect prompt injection in a fetched page, say). ``output`` is evaluated as
        prompt and response (like the input stage); a redaction is ``modified_response``."""
        return self.evaluate(
            policy, output, _utf8(output, "a tool's output"), _tool_request(name, call_id, context), environment,
            timeout,
            stage="tool_result", request_id=request_id,
        )  # fmt: skip

    def evaluate_many(
        self,
        policy: str,
        items: Iterable[Mapping[str, Any]],
        environment: str = DEFAULT_ENVIRONMENT,
        timeout: float | None = None,
    ) -> Iterator[RemoteDecision | CrossAuditError]:
        """Evaluate many ``{"prompt", "response", "context"?, "request_id"?, "stage"?}`` over one stream.
        Answers come as they are ready; match them by ``request_id`` (default: the index)."""
        yield from self._stream(self._evaluate_many(policy, items, environment, timeout))

    def submit_feedback(self, decision_id: str, label: str, rule: str = "", comment: str = "") -> str:
        return self._unary(self._submit_feedback(decision_id, label, rule, comment))

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
    ) -> UploadedEvaluator:
        """Validate, prepare (image build progress → ``progress(message, fraction)``) and store."""
        call = self._upload_evaluator(name, code, dependencies, progress, language, description, timeout)
        return self._uploaded(self._last(call))

    def get_evaluator(
        self, evaluator_id: str = "", *, name: str = "", version: int = 0, include_code: bool = False
    ) -> EvaluatorRecord:
        return self._unary(self._get_evaluator(evaluator_id, name, version, include_code))

    def list_evaluators(self, name: str = "") -> list[EvaluatorRecord]:
        return self._unary(self._list_evaluators(name))

    # reviews
    def list_reviews(
        self, state: ReviewState | str | None = None, policy: str = "", limit: int = 0
    ) -> list[ReviewInfo]:
        return self._unary(self._list_reviews(state, policy, limit))

    def resolve_review(
        self, review_id: str, state: ReviewState | str, reviewer: str = "", note: str = ""
    ) -> ReviewInfo:
        return self._unary(self._resolve_review(review_id, state, reviewer, note))

    # webhook deliveries
    def list_deliveries(self, state: OutboxState | str | None = None, limit: int = 0) -> list[OutboxRecord]:
        """This tenant's webhook deliveries, most recent first (``state``: pending, delivered, dead)."""
        return self._unary(self._list_deliveries(state, limit))

    def redeliver(self, delivery_id: str) -> OutboxRecord:
        """Queue a dead (or delivered) webhook again, due now, with a fresh attempt budget."""
        return self._unary(self._redeliver(delivery_id))

    # info
    def server_info(self) -> ServerInfo:
        """The server's version and where custom code runs (``weaker_isolation`` for the process sandbox)."""
        return self._unary(self._server_info())

    # audit
    def get_decision(self, decision_id: str) -> AuditRecord:
        """The audit record of an answered decision."""
        return self._unary(self._get_decision(decision_id))

    def erase_inputs(self, decision_id: str = "", context_field: tuple[str, str] | None = None) -> ErasureRecord:
        """Erase the retained inputs and raw audit text of one decision, or of every decision whose
        retained context has ``context_field`` (name, value); admin keys only (docs/retention.md)."""
        return self._unary(self._erase_inputs(decision_id, context_field))

    def list_decisions(self, policy: str = "", limit: int = 0) -> list[AuditRecord]:
        """Audit records, most recent first (``limit`` 0 = the server's cap)."""
        return self._unary(self._list_decisions(policy, limit))

    def list_labels(
        self,
        policy: str,
        environment: str = "",
        since: float | None = None,
        *,
        page_token: str = "",
        page_size: int = 0,
    ) -> LabelPage:
        """One page of ``policy``'s labelled decisions in ``environment`` (resolved reviews and
        feedback labels given since ``since``, oldest first), with their recorded scores and, where
        retained, their text; pass ``next_page_token`` back for the next page (docs/calibration.md).
        Admin and auditor keys."""
        return self._unary(self._list_labels(policy, environment, since, page_token, page_size))

    def log_key(self) -> LogKeyInfo:
        """The key that signs this tenant's decision log (pin it: verify with ``keys=``)."""
        return self._unary(self._log_key())

    def read_log(
        self, since: float | None = None, until: float | None = None, *, outside: bool = False, details: bool = False
    ) -> Iterator[LogChunk]:
        """This tenant's decision log, chunk by chunk (what verify and export read); ``outside``:
        the records written outside the log too; ``details``: each record's rules and receipt."""
        return self._stream(self._read_log(since, until, outside, details))

    def verify_log(self, keys: Sequence[PublicKey] | None = None, *, since: float | None = None) -> Report:
        """Read this tenant's log and verify it here, against ``keys`` (None: the keys the server
        names, which proves consistency, not the server's honesty: pin a key)."""
        checker = ChunkVerifier(keys if keys is not None else self.log_key().trusted)
        for chunk in self.read_log(since, outside=True):
            checker.feed(chunk)
        return checker.finish()

    def export_log(
        self,
        out: PathOrText,
        keys: Sequence[PublicKey] | None = None,
        *,
        since: float | None = None,
        until: float | None = None,
    ) -> Report:
        """Write this tenant's log from ``since`` to ``until`` as an offline bundle in ``out``
        (docs/evidence.md), verified as it is written; the report of that check."""
        info = self.log_key()
        if info.key is None:
            raise ConfigurationError(
                "this server signs no checkpoints (no evidence.signing_key_file): nothing to export"
            )
        chunks = self.read_log(since, until, details=True)
        return export_chunks(chunks, Path(out), info.key, keys or info.trusted, until is not None)

    def inclusion_proof(self, decision_id: str) -> InclusionProof:
        return self._unary(self._inclusion_proof(decision_id))

    def consistency_proof(self, old_size: int, new_size: int = 0) -> ConsistencyProof:
        return self._unary(self._consistency_proof(old_size, new_size))

    def receipt(self, decision_id: str) -> dict[str, Any]:
        """What decided ``decision_id`` (policy, engine, evaluators' provenance) and its place in the log."""
        return self._unary(self._receipt(decision_id))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- asyncio client -----------------------------------------------------------------------


class AsyncClient(ClientBase):
    """The asyncio twin of :class:`Client` (grpc.aio): every method, awaited (``evaluate_many``
    is an async iterator). Create it inside the running loop; use ``async with``."""

    def _open(self, target: str, creds: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
        if creds is None:
            return grpc.aio.insecure_channel(target, options=self._options)
        return grpc.aio.secure_channel(target, creds, options=self._options)

    async def _unary(self, call: Unary[T]) -> T:
        if call.method is None:
            return call.decode(None)
        request = self._sized(call.request)
        try:
            answer = await call.method(request, timeout=call.timeout or self.timeout, metadata=self._metadata())
        except grpc.RpcError as e:
            raise call.failed(self._error(e)) from None
        return call.decode(answer)

    async def _stream(self, call: Stream[T]) -> AsyncIterator[T]:
        # grpc.aio reads a request iterator in a task of its own, where a failure only cancels
        # the call: every request is built (and its size checked) first, so a bad item raises here, typed
        if isinstance(call.request, Iterator):
            request: Any = iter([self._sized(r) for r in call.request])
        else:
            request = self._sized(call.request)
        try:
            async for message in call.method(request, timeout=call.timeout, metadata=self._metadata()):
                yield call.decode(message)
        except grpc.RpcError as e:
            raise call.failed(self._error(e)) from None

    async def _last(self, call: Stream[T | None]) -> T | None:
        last = None
        async for item in self._stream(call):
            last = item if item is not None else last
        return last

    # policies
    async def validate_policy(
        self, path_or_text: PathOrText, *, base_dir: PathOrText | None = None
    ) -> list[PolicyIssue]:
        return await self._unary(self._validate_policy(path_or_text, base_dir))

    async def deploy_policy(
        self,
        path_or_text: PathOrText,
        environment: str = DEFAULT_ENVIRONMENT,
        *,
        base_dir: PathOrText | None = None,
        progress: ProgressCallback | None = None,
        timeout: float = DEFAULT_UPLOAD_TIMEOUT_S,
        shadow: float | None = None,
        canary: float | None = None,
        canary_key: str = "",
        notify: str = "",
    ) -> DeployResult:
        """As :meth:`Client.deploy_policy`; ``progress`` is called on the event loop's thread."""
        options = self._candidate(shadow, canary, canary_key, notify)
        call = self._deploy_policy(path_or_text, environment, base_dir, timeout, progress, options)
        if isinstance(call, Unary):
            return await self._unary(call)
        return self._deployed(await self._last(call))

    async def promote(self, name: str, environment: str = DEFAULT_ENVIRONMENT) -> PromoteResult:
        return await self._unary(self._promote(name, environment))

    async def discard(self, name: str, environment: str = DEFAULT_ENVIRONMENT) -> CandidateRecord:
        return await self._unary(self._discard(name, environment))

    async def shadow_report(self, name: str, environment: str = DEFAULT_ENVIRONMENT) -> ShadowReport:
        return await self._unary(self._shadow_report(name, environment))

    async def get_policy(self, name: str, environment: str = DEFAULT_ENVIRONMENT, version: int = 0) -> PolicyInfo:
        return await self._unary(self._get_policy(name, environment, version))

    async def replay_policy(
        self,
        path_or_text: PathOrText,
        against: str,
        options: ReplayOptions | None = None,
        *,
        base_dir: PathOrText | None = None,
        progress: Callable[[ReplayProgress], None] | None = None,
        timeout: float | None = None,
    ) -> ReplayReport:
        """As :meth:`Client.replay_policy`; ``progress`` is called on the event loop's thread."""
        call = self._replay(path_or_text, against, options or ReplayOptions(), base_dir, timeout, progress)
        return self._replayed(await self._last(call))

    async def list_policies(self, environment: str = "") -> list[PolicySummaryRecord]:
        return await self._unary(self._list_policies(environment))

    async def rollback(self, name: str, environment: str = DEFAULT_ENVIRONMENT, to_version: int = 0) -> RollbackResult:
        return await self._unary(self._rollback(name, environment, to_version))

    # evaluation
    async def evaluate(
        self,
        policy: str,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None = None,
        environment: str = DEFAULT_ENVIRONMENT,
        timeout: float | None = None,
        *,
        stage: str = "",
        request_id: str = "",
        provisional: bool = False,
    ) -> RemoteDecision:
        return await self._unary(
            self._evaluate(policy, prompt, response, context, environment, timeout, stage, request_id, provisional)
        )

    async def evaluate_tool_call(
        self,
        policy: str,
        name: str,
        arguments: str | Mapping[str, Any] | Sequence[Any],
        *,
        call_id: str = "",
        context: Mapping[str, Any] | None = None,
        prompt: str = "",
        environment: str = DEFAULT_ENVIRONMENT,
        timeout: float | None = None,
        request_id: str = "",
    ) -> RemoteDecision:
        """:meth:`Client.evaluate_tool_call`, awaited."""
        return await self.evaluate(
            policy, prompt, _arguments_text(arguments), _tool_request(name, call_id, context), environment, timeout,
            stage="tool_call", request_id=request_id,
        )  # fmt: skip

    async def evaluate_tool_result(
        self,
        policy: str,
        name: str,
        output: str,
        *,
        call_id: str = "",
        context: Mapping[str, Any] | None = None,
        environment: str = DEFAULT_ENVIRONMENT,
        timeout: float | None = None,
        request_id: str = "",
    ) -> RemoteDecision:
        """:meth:`Client.evaluate_tool_result`, awaited."""
        return await self.evaluate(
            policy, output, _utf8(output, "a tool's output"), _tool_request(name, call_id, context), environment,
            timeout,
            stage="tool_result", request_id=request_id,
        )  # fmt: skip

    async def evaluate_many(
        self,
        policy: str,
        items: Iterable[Mapping[str, Any]],
        environment: str = DEFAULT_ENVIRONMENT,
        timeout: float | None = None,
    ) -> AsyncIterator[RemoteDecision | CrossAuditError]:
        async for answer in self._stream(self._evaluate_many(policy, items, environment, timeout)):
            yield answer

    async def submit_feedback(self, decision_id: str, label: str, rule: str = "", comment: str = "") -> str:
        return await self._unary(self._submit_feedback(decision_id, label, rule, comment))

    # evaluators
    async def upload_evaluator(
        self,
        name: str,
        code: str,
        dependencies: Iterable[str] = (),
        progress: ProgressCallback | None = None,
        *,
        language: str = "python",
        description: str = "",
        timeout: float = DEFAULT_UPLOAD_TIMEOUT_S,
    ) -> UploadedEvaluator:
        call = self._upload_evaluator(name, code, dependencies, progress, language, description, timeout)
        return self._uploaded(await self._last(call))

    async def get_evaluator(
        self, evaluator_id: str = "", *, name: str = "", version: int = 0, include_code: bool = False
    ) -> EvaluatorRecord:
        return await self._unary(self._get_evaluator(evaluator_id, name, version, include_code))

    async def list_evaluators(self, name: str = "") -> list[EvaluatorRecord]:
        return await self._unary(self._list_evaluators(name))

    # reviews
    async def list_reviews(
        self, state: ReviewState | str | None = None, policy: str = "", limit: int = 0
    ) -> list[ReviewInfo]:
        return await self._unary(self._list_reviews(state, policy, limit))

    async def resolve_review(
        self, review_id: str, state: ReviewState | str, reviewer: str = "", note: str = ""
    ) -> ReviewInfo:
        return await self._unary(self._resolve_review(review_id, state, reviewer, note))

    # webhook deliveries
    async def list_deliveries(self, state: OutboxState | str | None = None, limit: int = 0) -> list[OutboxRecord]:
        return await self._unary(self._list_deliveries(state, limit))

    async def redeliver(self, delivery_id: str) -> OutboxRecord:
        return await self._unary(self._redeliver(delivery_id))

    # info
    async def server_info(self) -> ServerInfo:
        return await self._unary(self._server_info())

    # audit
    async def get_decision(self, decision_id: str) -> AuditRecord:
        return await self._unary(self._get_decision(decision_id))

    async def erase_inputs(self, decision_id: str = "", context_field: tuple[str, str] | None = None) -> ErasureRecord:
        return await self._unary(self._erase_inputs(decision_id, context_field))

    async def list_decisions(self, policy: str = "", limit: int = 0) -> list[AuditRecord]:
        return await self._unary(self._list_decisions(policy, limit))

    async def list_labels(
        self,
        policy: str,
        environment: str = "",
        since: float | None = None,
        *,
        page_token: str = "",
        page_size: int = 0,
    ) -> LabelPage:
        """As :meth:`Client.list_labels`."""
        return await self._unary(self._list_labels(policy, environment, since, page_token, page_size))

    async def log_key(self) -> LogKeyInfo:
        return await self._unary(self._log_key())

    def read_log(
        self, since: float | None = None, until: float | None = None, *, outside: bool = False, details: bool = False
    ) -> AsyncIterator[LogChunk]:
        return self._stream(self._read_log(since, until, outside, details))

    async def verify_log(self, keys: Sequence[PublicKey] | None = None, *, since: float | None = None) -> Report:
        """As :meth:`Client.verify_log`."""
        checker = ChunkVerifier(keys if keys is not None else (await self.log_key()).trusted)
        async for chunk in self.read_log(since, outside=True):
            checker.feed(chunk)
        return checker.finish()

    async def export_log(
        self,
        out: PathOrText,
        keys: Sequence[PublicKey] | None = None,
        *,
        since: float | None = None,
        until: float | None = None,
    ) -> Report:
        """As :meth:`Client.export_log`."""
        info = await self.log_key()
        if info.key is None:
            raise ConfigurationError(
                "this server signs no checkpoints (no evidence.signing_key_file): nothing to export"
            )
        exporter = Exporter(Path(out), info.key, keys or info.trusted, until is not None)
        async for chunk in self.read_log(since, until, details=True):
            exporter.feed(chunk)
        return exporter.finish()

    async def inclusion_proof(self, decision_id: str) -> InclusionProof:
        return await self._unary(self._inclusion_proof(decision_id))

    async def consistency_proof(self, old_size: int, new_size: int = 0) -> ConsistencyProof:
        return await self._unary(self._consistency_proof(old_size, new_size))

    async def receipt(self, decision_id: str) -> dict[str, Any]:
        return await self._unary(self._receipt(decision_id))

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
