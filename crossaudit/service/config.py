"""Service configuration: every limit of the gRPC layer is a named, documented value here."""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field
from pydantic.fields import FieldInfo

from crossaudit.api.limits import DEFAULT_ENVIRONMENT, DEFAULT_MAX_REQUEST_BYTES
from crossaudit.kernel.dsl import retention_seconds
from crossaudit.kernel.limits import (
    SETTINGS_SECTION,
    DependencyLimits,
    EngineLimits,
    Fraction,
    NonNegativeFloat,
    PoolLimits,
    Port,
    PositiveFloat,
    PositiveInt,
    SandboxLimits,
)
from crossaudit.kernel.pricing import DEFAULT_LLM_PRICES, LLMPrice
from crossaudit.modelserver.pool import ModelServerLimits
from crossaudit.outbox.limits import DeliveryLimits
from crossaudit.store.base import ERASE_BATCH
from crossaudit.store.postgres import PostgresLimits
from crossaudit.store.sqlite import SYNCHRONOUS_MODES

DEV_TENANT = "default"
# --dev serves the review console here unless console_port says otherwise (with --port 0, on an
# ephemeral port too, so parallel dev servers never collide).
DEV_CONSOLE_PORT = 8081
CONSOLE_OFF = "off"  # console_port: never serve the console, not even with --dev


@dataclass(frozen=True)
class ServiceLimits:
    """Caps of the gRPC layer (see docs/service.md)."""

    __pydantic_config__ = SETTINGS_SECTION

    max_request_bytes: Annotated[
        PositiveInt, Field(description="one request, everywhere: [below](#the-largest-request-limitsmax_request_bytes)")
    ] = DEFAULT_MAX_REQUEST_BYTES
    max_send_message_bytes: Annotated[
        PositiveInt,
        Field(
            description=(
                "one answer message; a ListDecisions page stops at half of it (the records' stored sizes, added up in"
                " SQL before any record is read)"
            )
        ),
    ] = 8 * 1024 * 1024
    max_concurrent_rpcs: Annotated[
        PositiveInt, Field(description="grpc.aio maximum_concurrent_rpcs; more = RESOURCE_EXHAUSTED")
    ] = 1024
    max_inflight_evaluations_per_tenant: Annotated[
        PositiveInt, Field(description="concurrent decisions of one tenant (rate limit)")
    ] = 256
    max_concurrent_evaluations: Annotated[
        PositiveInt,
        Field(
            description=(
                "decisions evaluated at once, all tenants together. Beyond, a call waits (within its deadline; past "
                "it DEADLINE_EXCEEDED naming this setting) and each freed slot goes to the waiting tenant holding the"
                " fewest slots for its `share:` (API-keys file, default 1; weighted fair queueing, "
                "`crossaudit/service/fairness.py`): a tenant flooding the server holds at most its share as soon as "
                "another waits. Free slots are taken with a counter (no lock, no store round trip)"
            )
        ),
    ] = 64
    max_concurrent_evaluations_tenant_fraction: Annotated[
        PositiveFloat,
        Field(
            le=1,  # a share of the slots: above 1 would mean no cap at all, said as one
            description=(
                "the most of those slots one tenant holds (rounded down, at least one), even when the rest are free: "
                "the rest stay open to other tenants, admitted at once beside a flood rather than at its next freed "
                "slot. A call over it waits in the same fair queue (DEADLINE_EXCEEDED naming this setting past its "
                "deadline)"
            ),
        ),
    ] = 0.75
    max_stream_inflight: Annotated[
        PositiveInt, Field(description="items of one EvaluateStream evaluated concurrently")
    ] = 16
    max_stream_items: Annotated[PositiveInt, Field(description="items one EvaluateStream may carry")] = 1_000_000
    default_deadline_s: Annotated[
        PositiveFloat, Field(description="decision budget when the caller sets no deadline")
    ] = 30.0
    answer_margin_s: Annotated[
        NonNegativeFloat, Field(description="kept back from the caller's deadline: engine grace + audit write + answer")
    ] = 0.05
    answer_margin_fraction: Annotated[
        Fraction, Field(description="... but never more than this share of a short deadline")
    ] = 0.25
    cutoff_margin_s: Annotated[
        NonNegativeFloat, Field(description="the engine is cancelled this long before the caller's deadline")
    ] = 0.02
    cutoff_margin_fraction: Annotated[
        Fraction, Field(description="... but never more than this share of a short deadline")
    ] = 0.1
    shutdown_grace_s: Annotated[NonNegativeFloat, Field(description="in-flight calls get this long on SIGTERM")] = 5.0
    store_check_interval_s: Annotated[
        PositiveFloat,
        Field(
            description=(
                "how often the store is checked; health is `NOT_SERVING` from the first failed check, `SERVING` again"
                " from the first that succeeds (which also replaces a PostgreSQL pool left backing off): the recovery"
                " lag after the database returns ([deploy.md](deploy.md#when-postgresql-goes-away))"
            )
        ),
    ] = 1.0
    store_check_timeout_s: Annotated[
        PositiveFloat, Field(description="a check not answered within this counts as failed")
    ] = 2.0
    max_list_items: Annotated[PositiveInt, Field(description="list answers are capped at this many items")] = 1_000
    max_name_length: Annotated[PositiveInt, Field(description="policy/evaluator names, environments, labels")] = 200
    max_request_id_chars: Annotated[
        PositiveInt,
        Field(
            description=(
                "a caller's `request_id` (a correlation id: a UUID is 36, a W3C traceparent 55); it is stored in the"
                " audit record and the signed log, so a longer one, or one holding a control character, is"
                " INVALID_ARGUMENT"
            )
        ),
    ] = 256
    max_code_bytes: Annotated[PositiveInt, Field(description="uploaded evaluator source")] = 256 * 1024
    max_evaluators_per_tenant: Annotated[
        PositiveInt,
        Field(
            description=(
                "uploaded evaluator versions one tenant stores (every upload of changed code is a new version; "
                "re-uploading identical code is free); one more is RESOURCE_EXHAUSTED (`QuotaExceededError` naming "
                "this setting), checked in the store's own transaction on both backends"
            )
        ),
    ] = 1_000
    max_evaluator_code_bytes_per_tenant: Annotated[
        PositiveInt,
        Field(
            description=(
                "UTF-8 bytes of all the evaluator code one tenant stores; an upload that would pass it is "
                "RESOURCE_EXHAUSTED naming this setting. Two uploads of one tenant on different PostgreSQL replicas "
                "at the same moment may each pass the check (at most `max_concurrent_uploads_per_tenant` per replica "
                "over)"
            )
        ),
    ] = 64 * 1024 * 1024
    max_open_reviews_per_tenant: Annotated[
        PositiveInt,
        Field(
            description=(
                "open review items of one tenant, every replica together (counted in the decision's own transaction)."
                " A decision whose reviews would pass it is still answered and its audit record written; its reviews "
                "are not opened, and each of its audited rules that asked for one carries `review_not_opened` naming "
                "this setting, its value and the open count. The answer's `review_ids` name only the reviews that "
                "opened, as the store recorded them"
            )
        ),
    ] = 10_000
    max_dependencies: Annotated[PositiveInt, Field(description="declared dependencies of one upload")] = 20
    max_feedback_comment_bytes: Annotated[PositiveInt, Field(description="one feedback comment")] = 4_096
    max_api_keys_file_bytes: Annotated[PositiveInt, Field(description="the API-keys file, read at start")] = 1024 * 1024
    min_api_key_length: Annotated[PositiveInt, Field(description="shortest API key accepted in the keys file")] = 16
    policy_cache_entries: Annotated[PositiveInt, Field(description="parsed policies kept per process")] = 256
    deployment_recheck_s: Annotated[
        NonNegativeFloat,
        Field(
            description=(
                "how long a process trusts the deployed version it last read: a deploy or rollback made by another "
                "replica sharing the store is in effect here within this bound (one indexed read per policy and "
                "environment per interval)"
            )
        ),
    ] = 1.0
    upload_timeout_s: Annotated[PositiveFloat, Field(description="validation + image build of one upload")] = 1_800.0
    max_concurrent_uploads_per_tenant: Annotated[
        PositiveInt,
        Field(
            description=(
                "image builds are heavy: a tenant's uploads being prepared at once in the server, every worker "
                "together (as replays); more = RESOURCE_EXHAUSTED"
            )
        ),
    ] = 2
    max_struct_depth: Annotated[
        PositiveInt,
        Field(
            description=(
                "Struct/list nesting of a request's Struct (Evaluate context); deeper is INVALID_ARGUMENT. The "
                "protobuf runtime cannot decode much deeper anyway (its recursion limit: ~33 levels)"
            )
        ),
    ] = 32
    max_audit_bytes_per_decision: Annotated[
        PositiveInt,
        Field(
            description=(
                "one decision's audit record (its rules' JSON, raw texts, a 512-byte fixed part). A larger record is "
                "stored cut down, in this order until it fits: violations (counted instead), prompt and response "
                "text, rule reasons (256 characters), evaluator results (counted), rule details (rule, status, "
                "passed, action kept), rules; its `truncated` field names this setting, its value, what was cut and "
                "the size before. Passed, action and errored rules are never cut: the record agrees with the answer"
            )
        ),
    ] = 256 * 1024
    max_audit_bytes_per_tenant_per_day: Annotated[
        PositiveInt,
        Field(
            description=(
                "a tenant's audit bytes per UTC day, every replica together (the store keeps one count per writer). "
                "Reached: the tenant's evaluations are RESOURCE_EXHAUSTED (`QuotaExceededError` naming this setting) "
                "before anything is evaluated, so no answered decision goes unaudited (logged once a minute per "
                "tenant); concurrent calls admitted just before may overshoot by at most "
                "`max_inflight_evaluations_per_tenant` × `max_audit_bytes_per_decision` per replica"
            )
        ),
    ] = 1024 * 1024 * 1024
    audit_usage_recheck_s: Annotated[
        PositiveFloat,
        Field(
            description=(
                "how long a replica trusts its count of a tenant's audit bytes today before reading the store's sum "
                "again (one read per tenant per interval, never one per call; its own writes are counted as they "
                "commit)"
            )
        ),
    ] = 1.0
    max_replay_decisions: Annotated[
        PositiveInt,
        Field(
            description=(
                "audit records one `policy replay` reads at most (its `--limit` is capped by it); a range holding more "
                "is reported as `more` with the most recent ones replayed ([replay.md](replay.md))"
            )
        ),
    ] = 100_000
    replay_page_size: Annotated[
        PositiveInt,
        Field(
            description=(
                "audit records a replay reads, and retained inputs it loads and decrypts, per page (keyset-paged: "
                "a deep page costs what the first does); progress is reported once per page"
            )
        ),
    ] = 500
    label_page_size: Annotated[
        PositiveInt,
        Field(
            description=(
                "labelled decisions (resolved reviews, feedback labels) one ListLabels page answers at most, with "
                "their retained inputs loaded and decrypted per page; a request's page_size is capped by it "
                "([calibration.md](calibration.md))"
            )
        ),
    ] = 500
    max_precision_labels: Annotated[
        PositiveInt,
        Field(
            description=(
                "labels of one policy the review console's rules page reads to measure each rule's precision "
                "(the oldest first)"
            )
        ),
    ] = 10_000
    replay_concurrency: Annotated[
        PositiveInt, Field(description="decisions one replay re-evaluates at once (within a page)")
    ] = 32
    max_replay_samples: Annotated[
        PositiveInt, Field(description="sample decision ids a replay report lists per category (a request's cap)")
    ] = 20
    max_concurrent_replays_per_tenant: Annotated[
        PositiveInt,
        Field(
            description=(
                "replays of one tenant running at once in the server, every worker together (a slot file locked in "
                "the data directory; a killed worker's are free at once); one more is RESOURCE_EXHAUSTED"
            )
        ),
    ] = 2


@dataclass(frozen=True)
class RolloutLimits:
    """Shadow deployments and canaries (docs/rollout.md): the shadow queue and what a canary is
    rolled back by."""

    __pydantic_config__ = SETTINGS_SECTION

    shadow_queue_size: Annotated[
        PositiveInt,
        Field(
            description=(
                "sampled decisions waiting for a shadow evaluation, per process; one more is dropped and counted "
                '(crossaudit_shadow_samples_total{outcome="dropped"} and the shadow report), never waited for'
            )
        ),
    ] = 1_000
    shadow_queue_bytes: Annotated[
        PositiveInt,
        Field(
            description=(
                "what the queued samples hold (prompt, response, context, the live evaluator results the candidate "
                "reuses), per process; a sample that would take it "
                "past this is dropped and counted like a full queue"
            )
        ),
    ] = 64 * 1024 * 1024
    shadow_workers: Annotated[
        PositiveInt, Field(description="shadow evaluations run at once per process (off the answer path)")
    ] = 2
    shadow_write_backlog: Annotated[
        PositiveInt,
        Field(
            description=(
                "evaluated shadow diffs waiting to be written (one transaction per batch); past it one is dropped and "
                "counted like a full queue"
            )
        ),
    ] = 10_000
    shadow_write_interval_s: Annotated[
        NonNegativeFloat,
        Field(
            description=(
                "the shadow's writer gathers diffs this long before each write (one transaction per batch: the live "
                "decisions' audit writes share the store); a report may lag by as much"
            )
        ),
    ] = 0.5
    shadow_timeout_s: Annotated[
        PositiveFloat, Field(description="one shadow evaluation; past it the diff records a timeout")
    ] = 10.0
    max_shadow_diffs_per_candidate: Annotated[
        PositiveInt,
        Field(description="per-decision diffs stored for one candidate; past it only the totals and flips grow"),
    ] = 10_000
    shadow_report_samples: Annotated[
        PositiveInt, Field(description="changed decisions a shadow report lists (most recent first)")
    ] = 20
    candidate_cache_entries: Annotated[
        PositiveInt,
        Field(
            description=(
                "(tenant, policy, environment) whose candidate (or its absence) a process remembers for "
                "limits.deployment_recheck_s"
            )
        ),
    ] = 10_000
    canary_min_decisions: Annotated[
        PositiveInt, Field(description="decisions a canary answers before its rates are compared with the active's")
    ] = 100
    canary_max_error_rate_increase: Annotated[
        Fraction,
        Field(
            description=(
                "a canary is rolled back when its share of decisions with an errored rule exceeds the active "
                "version's (same environment, since the canary started) by more than this"
            )
        ),
    ] = 0.05
    canary_max_block_rate_increase: Annotated[
        Fraction,
        Field(
            description=(
                "a canary is rolled back when its share of blocked decisions exceeds the active version's by more "
                "than this"
            )
        ),
    ] = 0.10
    canary_check_interval_s: Annotated[
        PositiveFloat,
        Field(description="a process recounts a canary's rates from the audit log at most this often"),
    ] = 2.0


@dataclass(frozen=True)
class ConsoleLimits:
    """Caps of the review console (``--console-port``; docs/review-console.md)."""

    __pydantic_config__ = SETTINGS_SECTION

    session_idle_s: Annotated[PositiveFloat, Field(description="a session unused this long is signed out")] = 15 * 60
    session_max_age_s: Annotated[PositiveFloat, Field(description="... and any session this long after sign-in")] = (
        8 * 3600
    )
    max_sessions: Annotated[
        PositiveInt,
        Field(
            description=(
                "sessions held in memory, all tenants together; when full, a new sign-in is refused (HTTP 503), "
                "nobody else is signed out"
            )
        ),
    ] = 10_000
    max_sessions_per_key: Annotated[
        PositiveInt, Field(description="sessions of one API key; beyond, that key's least recently used is signed out")
    ] = 20
    max_sessions_per_tenant: Annotated[
        PositiveInt,
        Field(description="sessions of one tenant's keys; beyond, that tenant's least recently used is signed out"),
    ] = 1_000
    signin_failures_per_minute: Annotated[
        PositiveInt, Field(description="failed sign-ins per client address; more = HTTP 429")
    ] = 10
    signins_per_minute_per_key: Annotated[
        PositiveInt, Field(description="successful sign-ins of one API key; more = HTTP 429")
    ] = 10
    signins_per_minute_per_client: Annotated[
        PositiveInt, Field(description="successful sign-ins from one client address; more = HTTP 429")
    ] = 30
    max_form_bytes: Annotated[PositiveInt, Field(description="one POSTed form")] = 64 * 1024
    page_items: Annotated[PositiveInt, Field(description="rows on a queue or audit-log page")] = 200
    max_concurrent_requests: Annotated[
        PositiveInt,
        Field(description="requests in flight (open connections waiting for a request do not count); more = HTTP 503"),
    ] = 64
    max_connections: Annotated[
        PositiveInt,
        Field(
            description=(
                "open connections; a new one beyond closes the oldest connection still waiting for its request, of "
                "the client holding the most (else the new one is closed)"
            )
        ),
    ] = 512
    max_connections_per_client: Annotated[
        PositiveInt,
        Field(
            description=(
                "open connections of one client address (IPv6: its /64); a new one beyond closes that client's own "
                "oldest waiting connection (else the new one is closed)"
            )
        ),
    ] = 16
    header_timeout_s: Annotated[
        PositiveFloat,
        Field(
            description=(
                "a request's head (request line and headers) must arrive within this of the connection's start or the"
                " previous answer; then the connection is closed"
            )
        ),
    ] = 10.0
    body_timeout_s: Annotated[
        PositiveFloat, Field(description="a POSTed form must arrive within this once its head did; more = HTTP 408")
    ] = 10.0


@dataclass(frozen=True)
class MetricsLimits:
    """Label cardinality of the Prometheus metrics (``--metrics-port``; docs/configuration.md)."""

    __pydantic_config__ = SETTINGS_SECTION

    max_tenant_labels: Annotated[
        PositiveInt,
        Field(
            description=(
                "the first this many tenants seen keep their name in the `tenant` label; later ones are counted as "
                "`other`, so a deployment with many tenants cannot grow the series without bound"
            )
        ),
    ] = 100
    max_model_labels: Annotated[
        PositiveInt,
        Field(
            description=(
                "LLM models named in a policy (tenant-controlled text) keep their name in the `model` label up to "
                "this many distinct names besides those of the price table; the rest are `other`"
            )
        ),
    ] = 50


@dataclass(frozen=True)
class WorkerLimits:
    """Supervision of ``crossaudit serve --workers N`` (N > 1; docs/service.md, "Workers")."""

    __pydantic_config__ = SETTINGS_SECTION

    max_workers: Annotated[
        PositiveInt,
        Field(description="most worker processes `workers` may ask for (each keeps its own warm pools)"),
    ] = 64
    start_timeout_s: Annotated[
        PositiveFloat,
        Field(
            description=(
                "how long one worker may take to start serving (the first one deploys policies/*.yaml on a data "
                "dir's first start, which may build images); past it the start fails"
            )
        ),
    ] = 1_800.0
    restart_backoff_s: Annotated[
        PositiveFloat, Field(description="wait before restarting a worker that died; doubled per quick death")
    ] = 0.5
    restart_backoff_max_s: Annotated[
        PositiveFloat, Field(description="the longest wait before restarting a worker that keeps dying")
    ] = 30.0
    stable_after_s: Annotated[
        PositiveFloat,
        Field(description="a worker that served this long before dying is restarted after the first wait again"),
    ] = 60.0
    stop_margin_s: Annotated[
        PositiveFloat,
        Field(
            description=(
                "on SIGTERM, workers get `limits.shutdown_grace_s` plus this to drain and close before the "
                "supervisor kills them"
            )
        ),
    ] = 10.0


@dataclass(frozen=True)
class RetentionConfig:
    """Retained evaluation inputs: the operator key, the server's ceiling, the purge worker
    (docs/retention.md). Nothing is retained until an operator key is configured."""

    __pydantic_config__ = SETTINGS_SECTION

    operator_key_file: Annotated[
        Path | None,
        Field(
            description="file (owner-only) holding the operator key: 32 random bytes, base64; wraps each tenant's key"
        ),
    ] = None
    operator_key_env: Annotated[
        str | None, Field(description="... or the name of the environment variable holding it (not both)")
    ] = None
    previous_operator_key_file: Annotated[
        Path | None,
        Field(description="during a rotation, the key being replaced: tenant keys it wrapped are rewrapped at start"),
    ] = None
    previous_operator_key_env: Annotated[str | None, Field(description="... or the variable holding it")] = None
    max_inputs_s: Annotated[
        PositiveFloat,
        Field(
            description=(
                "the longest any input is retained, whatever a tenant's `retention: {inputs: ...}` (API-keys file) or "
                "a policy's `settings.retention.inputs` ask"
            )
        ),
    ] = 30 * 86_400.0
    max_inputs_bytes_per_decision: Annotated[
        PositiveInt,
        Field(description="a decision whose sealed inputs are larger is answered and audited, its inputs not retained"),
    ] = 1024 * 1024
    max_index_fields: Annotated[
        PositiveInt,
        Field(
            description=(
                "top-level scalar context fields of one decision indexed for `audit erase --context-field`: the"
                " erasure_fields, then the others by name; fields beyond are retained but not findable by field"
            )
        ),
    ] = 32
    erasure_fields: Annotated[
        tuple[str, ...],
        Field(
            description=(
                "context fields always indexed for `audit erase --context-field`, before the others (so a request"
                " with many fields cannot push a data subject's id out of the index)"
            )
        ),
    ] = ("user_id",)
    max_load_ids: Annotated[
        PositiveInt, Field(description="decision ids one `Retention.load` call (one store round trip) may ask for")
    ] = 500
    purge_interval_s: Annotated[PositiveFloat, Field(description="the purge worker runs this often")] = 60.0
    purge_batch: Annotated[PositiveInt, Field(description="expired rows deleted per transaction")] = 1_000
    max_purge_batches: Annotated[
        PositiveInt, Field(description="transactions one purge run makes at most (the rest waits for the next run)")
    ] = 100
    rewrap_batch: Annotated[
        PositiveInt, Field(description="tenant keys rewrapped per transaction during an operator-key rotation")
    ] = 100
    erase_batch: Annotated[
        PositiveInt,
        Field(
            le=500,
            description=(
                "decisions one transaction of `audit erase --context-field` removes (their audit rules and outbox "
                "copies are read into memory); the erasure goes on in further transactions"
            ),
        ),
    ] = ERASE_BATCH
    max_erase_batches: Annotated[
        PositiveInt,
        Field(
            description=(
                "transactions one `audit erase --context-field` call makes at most; more matching decisions: "
                "RESOURCE_EXHAUSTED saying how many were erased, run it again for the rest"
            )
        ),
    ] = 1_000


@dataclass(frozen=True)
class EvidenceConfig:
    """The tamper-evident decision log (docs/evidence.md): every audited decision is a leaf of its
    tenant's Merkle log, and signed checkpoints of each log are written as it grows."""

    __pydantic_config__ = SETTINGS_SECTION

    log: Annotated[
        bool,
        Field(
            description=(
                "write every audited decision into its tenant's verifiable log (decisions written while it is off "
                "are outside the log: `audit verify` lists them)"
            )
        ),
    ] = True
    signing_key_file: Annotated[
        Path | None,
        Field(
            description=(
                "file (owner-only) holding the Ed25519 private key (PEM, PKCS#8) that signs checkpoints; unset: "
                "with SQLite, a key generated in the data directory on first start; with PostgreSQL it is required "
                "(every replica signs with the same key)"
            )
        ),
    ] = None
    signing_key_env: Annotated[
        str | None, Field(description="... or the name of the environment variable holding that PEM (not both)")
    ] = None
    previous_public_keys: Annotated[
        tuple[Path, ...],
        Field(description="public keys (PEM or verifier-key files) of retired signing keys, still trusted by verify"),
    ] = ()
    key_name: Annotated[
        str, Field(description="the signing key's name in checkpoints (signed-note key name: no spaces, no '+')")
    ] = "crossaudit"
    origin: Annotated[
        str, Field(description="the logs' name prefix: a tenant's log is '<origin>/<tenant>' in its checkpoints")
    ] = "crossaudit"
    checkpoint_every: Annotated[
        PositiveInt, Field(description="a tenant's log is checkpointed once this many decisions are unsigned ...")
    ] = 1_000
    checkpoint_interval_s: Annotated[PositiveFloat, Field(description="... or this often, whichever comes first")] = (
        10.0
    )
    checkpoint_batch: Annotated[
        PositiveInt, Field(description="leaf hashes read per transaction while checkpointing")
    ] = 50_000
    read_chunk: Annotated[
        PositiveInt,
        Field(le=10_000, description="records per message of `AuditService.ReadLog` (verify and export)"),
    ] = 1_000
    read_chunk_bytes: Annotated[
        PositiveInt,
        Field(
            le=8 * 1024 * 1024,
            description="bytes of records one `AuditService.ReadLog` message carries at most (a record is never split)",
        ),
    ] = 1024 * 1024
    max_proof_leaves: Annotated[
        PositiveInt,
        Field(
            description=(
                "leaf hashes one inclusion or consistency proof may read (a proof is built from the stored leaves); "
                "a larger log answers RESOURCE_EXHAUSTED naming this setting"
            )
        ),
    ] = 5_000_000


TracesExporter = Literal["none", "otlp", "console"]
RuleSpans = Literal["called", "all"]
OtlpProtocol = Literal["grpc", "http/protobuf"]
TracesSampler = Literal[
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
]


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry traces of decisions (docs/observability.md). Off unless an exporter is named
    or an OTLP endpoint given; the OpenTelemetry SDK's standard variables set these keys too (each
    key's `OTEL_*` variable below, above the file and below `CROSSAUDIT_TRACING__*`). Headers
    (`OTEL_EXPORTER_OTLP_HEADERS`: they may hold a token) are no setting: the exporter reads them."""

    __pydantic_config__ = SETTINGS_SECTION

    exporter: Annotated[
        TracesExporter | None,
        Field(
            description=(
                "where spans go: otlp, console (stdout, for a look), or none; unset: otlp when an endpoint is "
                "given, else none (tracing off: no span is made)"
            )
        ),
    ] = None
    endpoint: Annotated[
        str | None,
        Field(
            description=(
                "the OTLP collector's base URL (http/protobuf: `/v1/traces` is added; grpc: host:port or URL); "
                "unset: the exporter's default, localhost 4318 (http) or 4317 (grpc)"
            )
        ),
    ] = None
    traces_endpoint: Annotated[
        str | None, Field(description="the traces URL itself (used as given, before `endpoint`)")
    ] = None
    protocol: Annotated[OtlpProtocol, Field(description="OTLP over http/protobuf or grpc")] = "http/protobuf"
    service_name: Annotated[str, Field(description="the `service.name` resource attribute")] = "crossaudit"
    sampler: Annotated[
        TracesSampler,
        Field(
            description=(
                "which decisions are traced; parentbased_*: as the caller's traceparent says when it sends one"
            )
        ),
    ] = "parentbased_always_on"
    sampler_arg: Annotated[Fraction, Field(description="the share of traces the *traceidratio samplers keep")] = 1.0
    sdk_disabled: Annotated[bool, Field(description="true: tracing off whatever else says")] = False
    rule_spans: Annotated[
        RuleSpans,
        Field(
            description=(
                "called: a span for each rule that waits for an evaluator call (a rule decided at once from cached "
                "verdicts is counted on the engine's span, `crossaudit.rules.from_cache`); all: every rule, at some "
                "30-60 µs of CPU per span"
            )
        ),
    ] = "called"
    max_queue_size: Annotated[
        PositiveInt,
        Field(description="finished spans waiting for export, per process; past it new ones are dropped (counted)"),
    ] = 2048
    max_export_batch_size: Annotated[PositiveInt, Field(description="spans one export request carries at most")] = 512
    schedule_delay_s: Annotated[PositiveFloat, Field(description="spans are exported at least this often")] = 5.0
    export_timeout_s: Annotated[
        PositiveFloat, Field(description="one export request; past it the batch is dropped, never the decision")
    ] = 10.0
    max_attributes_per_span: Annotated[
        PositiveInt, Field(description="attributes one span keeps (the rest dropped)")
    ] = 64
    max_attribute_length: Annotated[
        PositiveInt, Field(description="characters of one attribute value kept (names, digests, ids)")
    ] = 256

    @property
    def exporter_in_force(self) -> TracesExporter:
        """The exporter in effect: none when disabled; unset means otlp exactly when an endpoint is given."""
        if self.sdk_disabled:
            return "none"
        if self.exporter is not None:
            return self.exporter
        return "otlp" if (self.endpoint or self.traces_endpoint) else "none"

    @property
    def on(self) -> bool:
        return self.exporter_in_force != "none"


@dataclass(frozen=True)
class CLI:
    """Marks a server setting that ``crossaudit serve`` takes as a flag of its own (every setting
    also takes ``--set KEY=VALUE``): ``--<key with dashes>`` unless ``flag`` names another."""

    flag: str | None = None
    metavar: str | None = None


def _retention_duration(value: Any) -> Any:
    """A retention duration as written (``7d``, ``12h``; ``off`` or ``0``: never), checked where it is
    set: a typo stops the start naming the key and its source, not the first retained decision."""
    if value is False:  # YAML 1.1 reads a bare off (--set retain_inputs=off, a file) as false
        return "off"
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    retention_seconds(value)  # ValueError naming the problem
    return value


RetentionDuration = Annotated[str, BeforeValidator(_retention_duration)]
Sandbox = Literal["docker", "process", "auto"]
DockerChannel = Literal["auto", "socket", "attach"]
ModelServers = Literal["subprocess", "docker"]
SQLiteSynchronous = Literal[SYNCHRONOUS_MODES]  # type: ignore[valid-type]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LogFormat = Literal["text", "json"]


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``crossaudit serve`` runs with; built from the layered settings
    (``crossaudit.service.settings``: defaults < file < environment < flags). Each field is a
    setting: its type and constraint validate it, its description is its ``--help`` and its line
    in docs/configuration.md, and :class:`CLI` gives it a flag of its own."""

    __pydantic_config__ = SETTINGS_SECTION

    host: Annotated[str, Field(description="listen address"), CLI()] = "127.0.0.1"
    port: Annotated[Port, Field(description="listen port (0 = any free port, printed on start)"), CLI()] = 50051
    data_dir: Annotated[
        Path, Field(description="the data directory: SQLite database, model store, lock"), CLI(metavar="DIR")
    ] = Path(".crossaudit")
    sandbox: Annotated[
        Sandbox,
        Field(description="where custom code runs (auto: docker where a daemon answers, else process)"),
        CLI(),
    ] = "auto"
    # How frames reach Docker sandbox agents (docs/sandbox-docker.md).
    docker_channel: Annotated[
        DockerChannel,
        Field(
            description=(
                "how frames reach Docker sandbox agents: socket (a private unix socket per container, no daemon in "
                "the path), attach (the container's attach stream, through the daemon), or auto (socket where the "
                "daemon is local and can bind our paths)"
            )
        ),
    ] = "auto"
    allow_process_sandbox: Annotated[
        bool,
        Field(description="with API keys, accept the process sandbox (weaker isolation than docker) for custom code"),
        CLI(),
    ] = False
    model_servers: Annotated[
        ModelServers | None,
        Field(
            description=(
                "how builtin model servers run: subprocess, or docker (no network, read-only root, models mounted "
                "read-only); unset: $CROSSAUDIT_MODEL_SERVERS, else subprocess"
            )
        ),
        CLI(),
    ] = None
    api_keys_file: Annotated[
        Path | None,
        Field(
            description=(
                "tenants file 'tenants: {name: [key, ...]}' or 'tenants: {name: {keys: [...], secrets: {NAME: {env: "
                "VAR}}}}' (docs/service.md)"
            )
        ),
        CLI(flag="--api-keys", metavar="FILE"),
    ] = None
    dev: Annotated[bool, Field(description="no keys, one 'default' tenant; loopback only"), CLI()] = False
    retain_inputs: Annotated[
        RetentionDuration | None,
        Field(
            description=(
                "with --dev: retain the 'default' tenant's evaluation inputs this long for replay and erasure (e.g. "
                "7d; off: never), sealed under retention.operator_key_* or else an operator key generated once in "
                "the data directory (0600); refused without --dev, where the API-keys file's `retention:` and an "
                "operator key say it (docs/retention.md)"
            )
        ),
        CLI(metavar="DURATION"),
    ] = None
    workers: Annotated[
        PositiveInt | Literal["auto"],
        Field(
            description=(
                "server processes on one port (SO_REUSEPORT), supervised: 1 = this process serves; auto = the "
                'cores this process may run on (docs/service.md, "Workers")'
            )
        ),
        CLI(metavar="N|auto"),
    ] = 1
    worker_limits: Annotated[WorkerLimits, Field(description="supervision of --workers N")] = field(
        default_factory=WorkerLimits
    )
    metrics_port: Annotated[
        Port | None, Field(description="serve Prometheus /metrics on this port (0 = any; unset: none)"), CLI()
    ] = None
    metrics_host: Annotated[str, Field(description="metrics listen address"), CLI()] = "127.0.0.1"
    tls_cert: Annotated[
        Path | None, Field(description="TLS certificate (PEM) of the gRPC port"), CLI(metavar="PEM")
    ] = None
    tls_key: Annotated[Path | None, Field(description="TLS private key (PEM) of the gRPC port"), CLI(metavar="PEM")] = (
        None
    )
    policies_dir: Annotated[
        Path | None,
        Field(description=f"policies/*.yaml deployed to {DEFAULT_ENVIRONMENT!r} on first start ('' = none)"),
        CLI(metavar="DIR"),
    ] = Path("policies")
    audit_raw_text: Annotated[
        bool, Field(description="store prompt/response text in the audit log (else SHA-256 hashes only)"), CLI()
    ] = False
    llm_base_url_hosts: Annotated[
        tuple[str, ...],
        Field(
            description=(
                "hosts every tenant's LLM base_url may name (the flag is repeatable; also llm_base_url_hosts in the "
                "API-keys file); with API keys and none listed, only the providers' default endpoints"
            )
        ),
        CLI(flag="--llm-base-url-host", metavar="HOST"),
    ] = ()
    store_synchronous: Annotated[
        SQLiteSynchronous, Field(description="SQLite synchronous: NORMAL survives kill -9, FULL power loss")
    ] = "NORMAL"
    store_url: Annotated[
        str | None,
        Field(
            description=(
                "postgresql://user:password@host/db: state shared by every replica (unset: SQLite in the data dir; "
                "also CROSSAUDIT_STORE)"
            )
        ),
        CLI(flag="--store", metavar="URL"),
    ] = None
    decision_log_url: Annotated[
        str | None,
        Field(
            description=(
                "push every decision to this HTTP endpoint in gzip'd JSON batches, at least once (Bearer "
                "$CROSSAUDIT_DECISION_LOG_TOKEN when set; docs/decision-log.md)"
            )
        ),
        CLI(metavar="URL"),
    ] = None
    decision_log_dir: Annotated[
        Path | None,
        Field(description="append every decision to DIR/decisions-YYYY-MM-DD.jsonl, at least once"),
        CLI(metavar="DIR"),
    ] = None
    limits: Annotated[ServiceLimits, Field(description="caps of the gRPC layer")] = field(default_factory=ServiceLimits)
    # ``console_listen_port`` is the port in effect.
    console_port: Annotated[
        Port | Literal["off"] | None,
        Field(
            description=(
                f"serve the review console (web UI) on this port (0 = any; 'off' = never; unset: off, with --dev "
                f"{DEV_CONSOLE_PORT}, or any free port with --port 0; docs/review-console.md)"
            )
        ),
        CLI(metavar="PORT|off"),
    ] = None
    console_host: Annotated[
        str,
        Field(description="review console listen address (any other than loopback needs --tls-cert/--tls-key)"),
        CLI(),
    ] = "127.0.0.1"
    console_limits: Annotated[ConsoleLimits, Field(description="caps of the review console")] = field(
        default_factory=ConsoleLimits
    )
    rollout_limits: Annotated[RolloutLimits, Field(description="shadow deployments and canaries")] = field(
        default_factory=RolloutLimits
    )
    engine_limits: Annotated[EngineLimits, Field(description="caps of the decision engine")] = field(
        default_factory=EngineLimits
    )
    sandbox_limits: Annotated[SandboxLimits, Field(description="resource caps of one custom-code call")] = field(
        default_factory=SandboxLimits
    )
    pool_limits: Annotated[PoolLimits, Field(description="warm sandbox pools")] = field(default_factory=PoolLimits)
    dependency_limits: Annotated[DependencyLimits, Field(description="custom evaluators' pip dependencies")] = field(
        default_factory=DependencyLimits
    )
    delivery_limits: Annotated[DeliveryLimits, Field(description="webhook and decision-log delivery")] = field(
        default_factory=DeliveryLimits
    )
    postgres_limits: Annotated[PostgresLimits, Field(description="the PostgreSQL store")] = field(
        default_factory=PostgresLimits
    )
    retention: Annotated[RetentionConfig, Field(description="retained evaluation inputs (docs/retention.md)")] = field(
        default_factory=RetentionConfig
    )
    evidence: Annotated[
        EvidenceConfig, Field(description="the tamper-evident decision log and receipts (docs/evidence.md)")
    ] = field(default_factory=EvidenceConfig)
    model_server_limits: Annotated[ModelServerLimits, Field(description="the builtins' model servers")] = field(
        default_factory=ModelServerLimits
    )
    metrics_limits: Annotated[MetricsLimits, Field(description="label cardinality of the metrics")] = field(
        default_factory=MetricsLimits
    )
    tracing: Annotated[TracingConfig, Field(description="OpenTelemetry traces (docs/observability.md)")] = field(
        default_factory=TracingConfig
    )
    llm_prices: Annotated[
        dict[str, LLMPrice],
        Field(
            description=(
                "USD per million tokens by model, for crossaudit_llm_cost_usd_total; entries given are added to (or "
                "replace) the built-in table; models not listed count tokens, no cost"
            )
        ),
    ] = field(default_factory=lambda: dict(DEFAULT_LLM_PRICES))
    log_level: Annotated[LogLevel, Field(description="the lowest level logged"), CLI()] = "INFO"
    log_format: Annotated[
        LogFormat,
        Field(description="text, or json: one JSON object per line, with the decision id on a decision's lines"),
        CLI(),
    ] = "text"

    @property
    def database_path(self) -> Path:
        return self.data_dir / "crossaudit.db"

    @property
    def retain_inputs_s(self) -> float:
        """Seconds ``--retain-inputs`` retains the dev tenant's inputs (0: not at all)."""
        return retention_seconds(self.retain_inputs) or 0.0

    @property
    def worker_count(self) -> int:
        """The worker processes in effect: ``auto`` is the cores this process may run on (its CPU
        affinity, which a container's cpuset narrows), at most ``worker_limits.max_workers``."""
        if self.workers == "auto":
            return max(1, min(len(os.sched_getaffinity(0)), self.worker_limits.max_workers))
        return int(self.workers)

    @property
    def console_default_port(self) -> bool:
        """True when the console port comes from --dev's default rather than from the operator."""
        return self.console_port is None and self.dev

    @property
    def console_listen_port(self) -> int | None:
        """The console's port in effect (None: no console). A new user's ``serve --dev`` gets the
        console without knowing the flag; an operator's server serves it only when asked."""
        if self.console_port == CONSOLE_OFF:
            return None
        if isinstance(self.console_port, int):
            return self.console_port
        if self.console_default_port:
            return DEV_CONSOLE_PORT if self.port else 0
        return None


# --- every setting, from the fields ----------------------------------------------------------------

ENV_PREFIX = "CROSSAUDIT_"
ENV_DELIMITER = "__"  # CROSSAUDIT_LIMITS__MAX_INFLIGHT_EVALUATIONS_PER_TENANT=64


def env_name(path: tuple[str, ...]) -> str:
    """The variable of a setting: ``CROSSAUDIT_<KEY>``, nested keys joined by ``__``."""
    return ENV_PREFIX + ENV_DELIMITER.join(path).upper()


@dataclass(frozen=True)
class SettingField:
    """One setting as its dataclass declares it: the dotted key, the annotation (type, constraint),
    the default, the description, and the flag of its own on ``crossaudit serve`` if it has one."""

    path: tuple[str, ...]
    annotation: Any
    default: Any
    description: str
    cli: CLI | None = None

    @property
    def key(self) -> str:
        return ".".join(self.path)

    @property
    def env(self) -> str:
        return env_name(self.path)

    @property
    def flag(self) -> str | None:
        if self.cli is None:
            return None
        return self.cli.flag or "--" + self.path[-1].replace("_", "-")


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _extras(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    """``Annotated[T, ...]`` as (T, its metadata, outermost first)."""
    if typing.get_origin(annotation) is Annotated:
        inner, *extras = typing.get_args(annotation)
        return inner, tuple(extras)
    return annotation, ()


def section_of(annotation: Any) -> type | None:
    """The settings section (a dataclass) an annotation holds, if any."""
    annotation, _ = _extras(annotation)
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = section_of(arg)
            if found is not None:
                return found
    return None


def setting_fields(dc: type = ServerConfig, prefix: tuple[str, ...] = ()) -> list[SettingField]:
    """Every setting a dataclass declares, sections walked into: what the flags, the docs and the
    checks are derived from."""
    hints = typing.get_type_hints(dc, include_extras=True)
    out: list[SettingField] = []
    for f in dataclasses.fields(dc):
        annotation = hints[f.name]
        inner, extras = _extras(annotation)
        section = section_of(inner)
        if section is not None and typing.get_origin(inner) is None:
            out.extend(setting_fields(section, (*prefix, f.name)))
            continue
        described = [x.description for x in extras if isinstance(x, FieldInfo) and x.description]
        cli = next((x for x in extras if isinstance(x, CLI)), None)
        out.append(SettingField((*prefix, f.name), annotation, _default(f), described[0] if described else "", cli))
    return out
