"""grpc.aio servicers: convert messages, call :class:`CrossAuditService`, map errors once."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from crossaudit.api import convert
from crossaudit.api.errors import abort, grpc_code, item_fields
from crossaudit.api.models import DeployResult, PolicyInfo, PromoteResult, RollbackResult, ServerInfo
from crossaudit.api.replayreport import ReplayReport
from crossaudit.governance.records import engine_version, judged_tool
from crossaudit.governance.replay import ReplayRequest
from crossaudit.kernel import tracing
from crossaudit.kernel.errors import (
    CrossAuditError,
    InvalidInputError,
    PolicyValidationError,
    RateLimitedError,
    ResultInvalidError,
)
from crossaudit.service.admission import EvaluationOutcome
from crossaudit.service.auth import Authenticator, UnknownMethodGate
from crossaudit.service.core import CrossAuditService
from crossaudit.service.decoding import DecodingGuard
from crossaudit.service.principals import Role
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

log = logging.getLogger("crossaudit.service")
ANSWER_ENVELOPE_BYTES = 64  # an EvaluateStream item's framing around the decision (+ its request_id)


class _Base:
    def __init__(self, service: CrossAuditService, auth: Authenticator) -> None:
        self.svc = service
        self.auth = auth

    def _count(self, method: str, code: grpc.StatusCode) -> None:
        self.svc.metrics.rpcs.labels(method, code.name).inc()

    @contextlib.asynccontextmanager
    async def _accounted(self, method: str, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        """Count the call's outcome and turn any exception into one status (never a traceback);
        shared by unary and streaming methods."""
        try:
            yield
        except asyncio.CancelledError:
            self._count(method, grpc.StatusCode.CANCELLED)
            raise
        except Exception as exc:
            if not isinstance(exc, CrossAuditError):
                log.exception("%s failed with an unexpected error", method, exc_info=exc)
            self._count(method, grpc_code(exc))
            await abort(context, exc)
        self._count(method, grpc.StatusCode.OK)


def unary(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Authenticate, run, count, and turn any exception into one status (never a traceback)."""
    method = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: _Base, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self._accounted(method, context):
            result = await fn(self, self.auth.tenant(context), request, context)
        return result

    return wrapper


def streaming(fn: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    method = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: _Base, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async with self._accounted(method, context):
            async for item in fn(self, self.auth.tenant(context), request, context):
                yield item

    return wrapper


class PolicyServicer(_Base, pol_grpc.PolicyServiceServicer):
    @unary
    async def ValidatePolicy(self, tenant: str, request: pol_pb.ValidatePolicyRequest, context: Any):
        try:
            policy = await self.svc.validate_policy(request.content, request.filename, tenant=tenant)
        except PolicyValidationError as e:
            return pol_pb.ValidatePolicyResponse(valid=False, issues=[convert.issue_to_pb(i) for i in e.issues])
        return pol_pb.ValidatePolicyResponse(
            valid=True,
            name=policy.name,
            declared_version=policy.version,
            rule_count=len(policy.rules),
            evaluator_count=len(policy.evaluators),
        )

    async def _deploy(
        self, tenant: str, request: pol_pb.DeployPolicyRequest, progress: Callable[[str, float], None] | None = None
    ) -> DeployResult:
        """A deploy, or (``candidate`` set) a shadow or canary candidate that is stored, not made active."""
        if request.HasField("candidate") and request.candidate.mode:
            opts = request.candidate
            version, cand, created = await self.svc.deploy_candidate(
                tenant,
                request.content,
                mode=opts.mode,
                share=opts.share,
                environment=request.environment,
                filename=request.filename,
                canary_key=opts.canary_key,
                notify_url=opts.notify_url,
                progress=progress,
            )
            return DeployResult(version, None, created, cand)
        version, deployment, created = await self.svc.deploy_policy(
            tenant, request.content, environment=request.environment, filename=request.filename, progress=progress
        )
        return DeployResult(version, deployment, created)

    @unary
    async def DeployPolicy(self, tenant: str, request: pol_pb.DeployPolicyRequest, context: Any):
        return convert.deploy_result_to_pb(await self._deploy(tenant, request))

    @streaming
    async def DeployPolicyStream(
        self, tenant: str, request: pol_pb.DeployPolicyRequest, context: Any
    ) -> AsyncIterator[pol_pb.DeployPolicyEvent]:
        def deploy(progress: Callable[[str, float], None]) -> Awaitable[Any]:
            return self._deploy(tenant, request, progress)

        async for item in _with_progress(deploy):
            if isinstance(item, _Done):
                yield pol_pb.DeployPolicyEvent(result=convert.deploy_result_to_pb(item.value))
            else:
                yield pol_pb.DeployPolicyEvent(progress=pol_pb.DeployProgress(message=item[0], fraction=item[1]))

    @unary
    async def GetPolicy(self, tenant: str, request: pol_pb.GetPolicyRequest, context: Any):
        rec, deployments = await self.svc.get_policy(
            tenant, request.name, environment=request.environment, version=request.version
        )
        return convert.policy_info_to_pb(PolicyInfo(rec, tuple(deployments)))

    @unary
    async def ListPolicies(self, tenant: str, request: pol_pb.ListPoliciesRequest, context: Any):
        items = await self.svc.list_policies(tenant, request.environment)
        return pol_pb.ListPoliciesResponse(policies=[convert.summary_to_pb(s) for s in items])

    @unary
    async def RollbackPolicy(self, tenant: str, request: pol_pb.RollbackPolicyRequest, context: Any):
        dep, previous = await self.svc.rollback_policy(
            tenant, request.name, environment=request.environment, to_version=request.to_version
        )
        return convert.rollback_to_pb(RollbackResult(dep, previous))

    @unary
    async def PromotePolicy(self, tenant: str, request: pol_pb.PromotePolicyRequest, context: Any):
        cand, dep = await self.svc.promote_policy(tenant, request.name, request.environment)
        return convert.promote_to_pb(PromoteResult(dep, cand))

    @unary
    async def DiscardCandidate(self, tenant: str, request: pol_pb.DiscardCandidateRequest, context: Any):
        cand = await self.svc.discard_candidate(tenant, request.name, request.environment)
        return pol_pb.DiscardCandidateResponse(candidate=convert.candidate_to_pb(cand))

    @unary
    async def ShadowReport(self, tenant: str, request: pol_pb.ShadowReportRequest, context: Any):
        report = await self.svc.shadow_report(tenant, request.name, request.environment)
        return convert.shadow_report_to_pb(report)


class EvaluationServicer(_Base, ev_grpc.EvaluationServiceServicer):
    async def _evaluate(self, tenant: str, request: ev_pb.EvaluateRequest, context: Any) -> ev_pb.EvaluateResponse:
        limits = self.svc.limits
        caller_context = convert.from_struct(request.context, max_depth=limits.max_struct_depth, what="context")
        tool = judged_tool(request.stage, caller_context)

        def encode(out: EvaluationOutcome) -> ev_pb.EvaluateResponse:
            # Runs before the audit write, so a decision that cannot be sent is never audited.
            msg = convert.decision_to_pb(
                out.decision,
                revision=out.revision,
                environment=out.environment,
                review_ids=out.review_ids,
                request_id=request.request_id,
                stage=request.stage,
                tool_name=tool.get("name", ""),
                tool_call_id=tool.get("call_id", ""),
            )
            size = msg.ByteSize() + len(request.request_id.encode()) + ANSWER_ENVELOPE_BYTES
            if size > limits.max_send_message_bytes:
                raise ResultInvalidError(
                    f"the decision is {size} bytes, over the {limits.max_send_message_bytes}-byte answer limit"
                )
            return msg

        out = await self.svc.evaluate(
            tenant,
            trace_parent=_trace_parent(context) if tracing.enabled() else None,
            policy=request.policy,
            prompt=request.prompt,
            response=request.response,
            context=caller_context,
            environment=request.environment,
            time_remaining=context.time_remaining(),
            request_id=request.request_id,
            encode=encode,
            stage=request.stage,
            provisional=request.provisional,
        )
        return out.answer

    @unary
    async def Evaluate(self, tenant: str, request: ev_pb.EvaluateRequest, context: Any):
        return await self._evaluate(tenant, request, context)

    @streaming
    async def EvaluateStream(
        self, tenant: str, request_iterator: AsyncIterator[ev_pb.EvaluateRequest], context: Any
    ) -> AsyncIterator[ev_pb.EvaluateStreamResponse]:
        limits = self.svc.limits
        results: asyncio.Queue[Any] = asyncio.Queue()  # bounded by the slots
        slots = asyncio.Semaphore(limits.max_stream_inflight)
        running: set[asyncio.Task[None]] = set()
        done = object()

        async def one(req: ev_pb.EvaluateRequest) -> None:
            try:
                decision = await self._evaluate(tenant, req, context)
                item = ev_pb.EvaluateStreamResponse(request_id=req.request_id, decision=decision)
            except Exception as exc:  # one item's failure is its answer; the stream goes on
                if not isinstance(exc, CrossAuditError):
                    log.exception("EvaluateStream item failed with an unexpected error", exc_info=exc)
                error = ev_pb.ItemError(**item_fields(exc))  # the one codec: type, flag, details
                item = ev_pb.EvaluateStreamResponse(request_id=req.request_id, error=error)
            await results.put(item)  # its slot is released once the answer is sent

        async def reader() -> None:
            try:
                count = 0
                async for req in request_iterator:
                    count += 1
                    if count > limits.max_stream_items:
                        raise RateLimitedError(f"a stream carries at most {limits.max_stream_items} requests")
                    await slots.acquire()
                    task = asyncio.create_task(one(req))
                    running.add(task)
                    task.add_done_callback(running.discard)
                if running:
                    await asyncio.gather(*list(running))
                await results.put(done)
            except Exception as exc:
                await results.put(exc)

        feeder = asyncio.create_task(reader())
        try:
            while True:
                item = await results.get()
                if item is done:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
                # evaluating + answered-but-unsent items stay within max_stream_inflight
                slots.release()
        finally:
            feeder.cancel()
            for task in list(running):
                task.cancel()

    @unary
    async def SubmitFeedback(self, tenant: str, request: ev_pb.SubmitFeedbackRequest, context: Any):
        rec = await self.svc.submit_feedback(
            tenant, request.decision_id, rule=request.rule, label=request.label, comment=request.comment
        )
        return ev_pb.SubmitFeedbackResponse(feedback_id=rec.id)


TRACE_METADATA = ("traceparent", "tracestate")  # W3C Trace Context, as the caller's gRPC metadata


def _trace_parent(context: Any) -> Any:
    """The caller's trace context from its metadata (None when it sent none: a new trace)."""
    carrier = {k: v for k, v in context.invocation_metadata() or () if k in TRACE_METADATA and isinstance(v, str)}
    return tracing.extract(carrier) if carrier else None


@dataclass(frozen=True)
class _Done:
    value: Any  # what the work returned: the last item of :func:`_with_progress`


async def _with_progress(work: Callable[[Callable[[str, float], None]], Awaitable[Any]]) -> AsyncIterator[Any]:
    """Run ``work(progress)`` and yield its progress as ``(message, fraction)`` while it runs (at
    most ~20 a second unless the fraction moves, either way: image builds report every output
    line, and a new phase may start below the last one's fraction), then
    ``_Done(result)``. Progress may come from build threads; what is queued when the work ends
    is still sent, so the last step (``evaluator ready``) is not lost."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
    last = [0.0, -1.0]  # time, fraction of the last forwarded event (throttle)

    def progress(message: str, fraction: float) -> None:  # may run in a build thread
        loop.call_soon_threadsafe(events.put_nowait, (str(message)[:500], float(fraction)))

    def due(fraction: float) -> bool:
        now = time.monotonic()
        if now - last[0] < 0.05 and abs(fraction - last[1]) < 0.01 and fraction < 1.0:
            return False
        last[:] = [now, fraction]
        return True

    task = asyncio.create_task(work(progress))
    try:
        while not task.done():
            getter = asyncio.create_task(events.get())
            finished, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in finished:
                getter.cancel()
                break
            message, fraction = getter.result()
            if due(fraction):
                yield message, max(0.0, min(1.0, fraction))
        result = await task
    finally:
        task.cancel()
    await asyncio.sleep(0)  # callbacks the work scheduled just before it ended
    while not events.empty():
        message, fraction = events.get_nowait()
        if due(fraction):
            yield message, max(0.0, min(1.0, fraction))
    yield _Done(result)


class EvaluatorServicer(_Base, evr_grpc.EvaluatorServiceServicer):
    @streaming
    async def UploadEvaluator(
        self, tenant: str, request: evr_pb.UploadEvaluatorRequest, context: Any
    ) -> AsyncIterator[evr_pb.UploadEvaluatorEvent]:
        def upload(progress: Callable[[str, float], None]) -> Awaitable[Any]:
            return self.svc.upload_evaluator(
                tenant,
                name=request.name,
                code=request.code,
                language=request.language or "python",
                dependencies=list(request.dependencies),
                description=request.description,
                progress=progress,
            )

        async for item in _with_progress(upload):
            if isinstance(item, _Done):
                rec, created = item.value
                yield convert.uploaded_to_pb(rec, created)
            else:
                yield evr_pb.UploadEvaluatorEvent(progress=evr_pb.UploadProgress(message=item[0], fraction=item[1]))

    @unary
    async def GetEvaluator(self, tenant: str, request: evr_pb.GetEvaluatorRequest, context: Any):
        rec = await self.svc.get_evaluator(tenant, evaluator_id=request.id, name=request.name, version=request.version)
        return convert.evaluator_to_pb(rec, include_code=request.include_code)

    @unary
    async def ListEvaluators(self, tenant: str, request: evr_pb.ListEvaluatorsRequest, context: Any):
        recs = await self.svc.list_evaluators(tenant, request.name)
        return evr_pb.ListEvaluatorsResponse(evaluators=[convert.evaluator_to_pb(r) for r in recs])


class ReviewServicer(_Base, rev_grpc.ReviewServiceServicer):
    @unary
    async def ListReviews(self, tenant: str, request: rev_pb.ListReviewsRequest, context: Any):
        state = convert.REVIEW_STATE_FROM_PB.get(request.state) if request.state else None
        recs = await self.svc.list_reviews(
            tenant, state=state, policy=request.policy, limit=request.limit, principal=self.auth.principal(context)
        )
        return rev_pb.ListReviewsResponse(reviews=[convert.review_to_pb(r) for r in recs])

    @unary
    async def ResolveReview(self, tenant: str, request: rev_pb.ResolveReviewRequest, context: Any):
        state = convert.REVIEW_STATE_FROM_PB.get(request.state)
        if state is None or state is ReviewState.OPEN:
            raise InvalidInputError("state must be APPROVED, REJECTED or DISMISSED")
        # the principal's role and reviewer_roles are checked again where the item is resolved
        principal = self.auth.principal(context)
        rec = await self.svc.resolve_review(
            tenant, request.id, state, reviewer=request.reviewer, note=request.note, principal=principal
        )
        return convert.review_to_pb(rec)


class DeliveryServicer(_Base, dlv_grpc.DeliveryServiceServicer):
    @unary
    async def ListDeliveries(self, tenant: str, request: dlv_pb.ListDeliveriesRequest, context: Any):
        state = convert.DELIVERY_STATE_FROM_PB.get(request.state) if request.state else None
        if request.limit < 0:
            raise InvalidInputError("limit must not be negative")
        cap = min(request.limit or self.svc.limits.max_list_items, self.svc.limits.max_list_items)
        recs = await self.svc.list_deliveries(tenant, state=state, limit=cap)
        return dlv_pb.ListDeliveriesResponse(deliveries=[convert.delivery_to_pb(m) for m in recs])

    @unary
    async def RedeliverDelivery(self, tenant: str, request: dlv_pb.RedeliverDeliveryRequest, context: Any):
        return convert.delivery_to_pb(await self.svc.redeliver(tenant, request.id))


class AuditServicer(_Base, audit_grpc.AuditServiceServicer):
    @unary
    async def GetDecision(self, tenant: str, request: audit_pb.GetDecisionRequest, context: Any):
        return convert.audit_to_pb(await self.svc.get_decision(tenant, request.decision_id))

    @unary
    async def ListDecisions(self, tenant: str, request: audit_pb.ListDecisionsRequest, context: Any):
        recs = await self.svc.list_decisions(tenant, policy=request.policy, limit=request.limit)
        return audit_pb.ListDecisionsResponse(decisions=[convert.audit_to_pb(r) for r in recs])

    @unary
    async def EraseInputs(self, tenant: str, request: audit_pb.EraseInputsRequest, context: Any):
        # admin keys only: the permission table lists EraseInputs for no other role
        which = request.WhichOneof("selector")
        field = (request.context_field.name, request.context_field.value) if which == "context_field" else None
        erasure = await self.svc.erase_inputs(
            tenant,
            actor=self.auth.principal(context).describe(),
            decision_id=request.decision_id if which == "decision_id" else "",
            context_field=field,
        )
        return convert.erasure_to_pb(erasure)

    # --- the decision log (docs/evidence.md): the caller's tenant's log, never another's ---------

    @unary
    async def GetLogKey(self, tenant: str, request: audit_pb.GetLogKeyRequest, context: Any):
        ev = self.svc.evidence_log()
        return convert.log_key_to_pb(ev.origin(tenant), ev.key.public if ev.key else None, ev.trusted)

    @streaming
    async def ReadLog(self, tenant: str, request: audit_pb.ReadLogRequest, context: Any) -> AsyncIterator[Any]:
        since = convert.seconds(request.since) if request.HasField("since") else None
        until = convert.seconds(request.until) if request.HasField("until") else None
        log = self.svc.evidence_log().read(
            tenant, since=since, until=until, outside=request.outside, details=request.details
        )
        async for chunk in log:
            yield convert.log_chunk_to_pb(chunk)

    @unary
    async def GetInclusionProof(self, tenant: str, request: audit_pb.GetInclusionProofRequest, context: Any):
        return convert.inclusion_to_pb(await self.svc.evidence_log().inclusion(tenant, request.decision_id))

    @unary
    async def GetConsistencyProof(self, tenant: str, request: audit_pb.GetConsistencyProofRequest, context: Any):
        proof = await self.svc.evidence_log().consistency(tenant, request.old_size, request.new_size)
        return convert.consistency_to_pb(proof)

    @unary
    async def GetReceipt(self, tenant: str, request: audit_pb.GetReceiptRequest, context: Any):
        rec = await self.svc.get_decision(tenant, request.decision_id)
        return convert.receipt_to_pb(rec, self.svc.evidence_log().origin(tenant))

    @unary
    async def ListLabels(self, tenant: str, request: audit_pb.ListLabelsRequest, context: Any):
        # admin and auditor keys (principals.PERMISSIONS); the retained text to admin keys alone
        # (as replay): an auditor gets the labels and the recorded scores
        with_text = self.auth.principal(context).role is Role.ADMIN
        page = await self.svc.list_labels(
            tenant,
            policy=request.policy,
            environment=request.environment,
            since=convert.seconds(request.since) if request.HasField("since") else None,
            page_token=request.page_token,
            page_size=request.page_size,
            with_text=with_text,
        )
        return convert.label_page_to_pb(page)


class ReplayServicer(_Base, rpl_grpc.ReplayServiceServicer):
    """Admin only, as DeployPolicy (principals.PERMISSIONS lists it for no other role): a replay
    reads the retained text of the tenant's decisions."""

    @streaming
    async def Replay(self, tenant: str, request: rpl_pb.ReplayRequest, context: Any) -> AsyncIterator[Any]:
        req = ReplayRequest(
            content=request.content,
            against=request.against,
            filename=request.filename,
            environment=request.environment,
            since=request.since if request.HasField("since") else None,
            until=request.until if request.HasField("until") else None,
            limit=request.limit,
            rerun_llm=request.rerun_llm,
            samples=request.samples,
            estimate_only=request.estimate_only,
        )
        async for item in self.svc.replay(tenant, req):
            if isinstance(item, ReplayReport):
                yield convert.replay_report_to_pb(item)
            else:
                yield convert.replay_progress_to_pb(item)


class InfoServicer(_Base, info_grpc.InfoServiceServicer):
    """Version and isolation of this server, so a caller can tell a weaker sandbox apart."""

    @unary
    async def GetServerInfo(self, tenant: str, request: info_pb.GetServerInfoRequest, context: Any) -> Any:
        info = self.svc.sandbox.info() if self.svc.sandbox is not None else {}
        backend = str(info.get("backend", ""))
        return convert.server_info_to_pb(
            ServerInfo(
                version=engine_version(),
                tenant=tenant,
                multi_tenant=not self.auth.dev,
                sandbox_backend=backend,
                isolation=str(info.get("isolation", "")),
                weaker_isolation=backend == "process",
            )
        )


def add_servicers(server: grpc.aio.Server, service: CrossAuditService, auth: Authenticator) -> list[str]:
    """Register the public services; returns their full names (for health/reflection).
    Every call is authorized before its servicer runs, and every request deserializer is
    guarded: bytes that do not decode are INVALID_ARGUMENT."""
    rpcs = service.metrics.rpcs
    server.add_generic_rpc_handlers((UnknownMethodGate(auth),))
    server = DecodingGuard(  # type: ignore[assignment]
        server,
        service.limits.max_struct_depth,
        lambda method: rpcs.labels(method, "INVALID_ARGUMENT").inc(),
        authorize=auth.authorize,
        max_bytes=service.limits.max_request_bytes,
    )
    info_grpc.add_InfoServiceServicer_to_server(InfoServicer(service, auth), server)
    pol_grpc.add_PolicyServiceServicer_to_server(PolicyServicer(service, auth), server)
    ev_grpc.add_EvaluationServiceServicer_to_server(EvaluationServicer(service, auth), server)
    evr_grpc.add_EvaluatorServiceServicer_to_server(EvaluatorServicer(service, auth), server)
    rev_grpc.add_ReviewServiceServicer_to_server(ReviewServicer(service, auth), server)
    audit_grpc.add_AuditServiceServicer_to_server(AuditServicer(service, auth), server)
    dlv_grpc.add_DeliveryServiceServicer_to_server(DeliveryServicer(service, auth), server)
    rpl_grpc.add_ReplayServiceServicer_to_server(ReplayServicer(service, auth), server)
    return [
        info_pb.DESCRIPTOR.services_by_name["InfoService"].full_name,
        audit_pb.DESCRIPTOR.services_by_name["AuditService"].full_name,
        pol_pb.DESCRIPTOR.services_by_name["PolicyService"].full_name,
        ev_pb.DESCRIPTOR.services_by_name["EvaluationService"].full_name,
        evr_pb.DESCRIPTOR.services_by_name["EvaluatorService"].full_name,
        rev_pb.DESCRIPTOR.services_by_name["ReviewService"].full_name,
        dlv_pb.DESCRIPTOR.services_by_name["DeliveryService"].full_name,
        rpl_pb.DESCRIPTOR.services_by_name["ReplayService"].full_name,
    ]
