"""Versioned schema migrations, one list per backend.

Each backend applies, in order and in one transaction per step, the steps its database has not
seen yet, and records how far it got: SQLite in ``PRAGMA user_version``, PostgreSQL in the
``schema_migrations`` table (under an advisory lock, so replicas starting together apply each
step once). Steps are append-only: a schema change is a new step at the end of both lists.
SQLite's first step keeps ``IF NOT EXISTS`` because databases created before migrations were
versioned already hold its tables.
"""

from __future__ import annotations

SQLITE: tuple[str, ...] = (
    # 1: policies, deployments, evaluators, decisions, reviews, feedback
    """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS policy_versions (
    tenant TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL,
    declared_version TEXT NOT NULL, digest TEXT NOT NULL, description TEXT NOT NULL,
    content TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (tenant, name, version)
);
CREATE INDEX IF NOT EXISTS policy_versions_digest ON policy_versions (tenant, name, digest);
CREATE TABLE IF NOT EXISTS deployments (
    tenant TEXT NOT NULL, name TEXT NOT NULL, environment TEXT NOT NULL,
    version INTEGER NOT NULL, deployed_at REAL NOT NULL,
    PRIMARY KEY (tenant, name, environment)
);
CREATE TABLE IF NOT EXISTS deployment_history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL, name TEXT NOT NULL, environment TEXT NOT NULL,
    version INTEGER NOT NULL, kind TEXT NOT NULL, at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS deployment_history_key ON deployment_history (tenant, name, environment, seq);
CREATE TABLE IF NOT EXISTS evaluators (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL,
    language TEXT NOT NULL, dependencies TEXT NOT NULL, digest TEXT NOT NULL,
    code TEXT NOT NULL, description TEXT NOT NULL, created_at REAL NOT NULL,
    UNIQUE (tenant, name, version)
);
CREATE INDEX IF NOT EXISTS evaluators_digest ON evaluators (tenant, name, digest);
CREATE TABLE IF NOT EXISTS decisions (
    decision_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, policy TEXT NOT NULL,
    policy_revision INTEGER NOT NULL, policy_version TEXT NOT NULL, policy_digest TEXT NOT NULL,
    environment TEXT NOT NULL, passed INTEGER NOT NULL, action TEXT NOT NULL,
    rules TEXT NOT NULL, errored_rules TEXT NOT NULL, latency_ms REAL NOT NULL,
    prompt_sha256 TEXT NOT NULL, response_sha256 TEXT NOT NULL, context_sha256 TEXT NOT NULL,
    modified_response_sha256 TEXT, prompt TEXT, response TEXT,
    request_id TEXT NOT NULL, created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS decisions_tenant ON decisions (tenant, created_at);
CREATE TABLE IF NOT EXISTS reviews (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, decision_id TEXT NOT NULL, policy TEXT NOT NULL,
    policy_revision INTEGER NOT NULL, environment TEXT NOT NULL, rule TEXT NOT NULL,
    kind TEXT NOT NULL, state TEXT NOT NULL, params TEXT NOT NULL, created_at REAL NOT NULL,
    resolved_at REAL, reviewer TEXT NOT NULL, note TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS reviews_tenant ON reviews (tenant, state, created_at);
CREATE TABLE IF NOT EXISTS feedback (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, decision_id TEXT NOT NULL, rule TEXT NOT NULL,
    label TEXT NOT NULL, comment TEXT NOT NULL, created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS feedback_decision ON feedback (tenant, decision_id);
""",
    # 2: the outbox of webhooks and decision-log entries (crossaudit.outbox)
    """
CREATE TABLE IF NOT EXISTS outbox (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, kind TEXT NOT NULL, decision_id TEXT NOT NULL,
    rule TEXT NOT NULL, payload TEXT NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL,
    next_attempt_at REAL NOT NULL, lease_until REAL NOT NULL, last_error TEXT NOT NULL,
    last_status INTEGER NOT NULL, created_at REAL NOT NULL, delivered_at REAL
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (state, kind, next_attempt_at);
CREATE INDEX IF NOT EXISTS outbox_tenant ON outbox (tenant, created_at);
""",
    # 3: rate_limit buckets shared by the processes of one store (crossaudit.service.ratelimits)
    """
CREATE TABLE IF NOT EXISTS rate_buckets (key TEXT PRIMARY KEY, tokens REAL NOT NULL, updated REAL NOT NULL);
""",
    # 4: the outbox by tenant: fair claims (one seek per tenant) and pending counts per tenant
    """
CREATE INDEX IF NOT EXISTS outbox_tenant_due ON outbox (kind, state, tenant, next_attempt_at);
""",
    # 5: audit quotas: what a decision over limits.max_audit_bytes_per_decision lost, and each
    # tenant's audit bytes per UTC day (one row per writer, so replicas never update one hot row)
    """
ALTER TABLE decisions ADD COLUMN truncated TEXT NOT NULL DEFAULT '';
CREATE TABLE IF NOT EXISTS audit_usage (
    tenant TEXT NOT NULL, day INTEGER NOT NULL, writer TEXT NOT NULL, bytes INTEGER NOT NULL,
    PRIMARY KEY (tenant, day, writer)
);
""",
    # 6: retained inputs (docs/retention.md): sealed rows, their blind index for erasure by
    # context field, the tenants' wrapped data keys, the erasures done; the decisions say until
    # when their inputs are kept and when they were erased
    """
ALTER TABLE decisions ADD COLUMN inputs_retained_until REAL;
ALTER TABLE decisions ADD COLUMN inputs_erased_at REAL;
CREATE TABLE IF NOT EXISTS retained_inputs (
    tenant TEXT NOT NULL, decision_id TEXT NOT NULL, policy TEXT NOT NULL, environment TEXT NOT NULL,
    created_at REAL NOT NULL, expires_at REAL NOT NULL, key_id TEXT NOT NULL,
    nonce BLOB NOT NULL, ciphertext BLOB NOT NULL,
    PRIMARY KEY (tenant, decision_id)
);
CREATE INDEX IF NOT EXISTS retained_inputs_expiry ON retained_inputs (expires_at);
CREATE TABLE IF NOT EXISTS retained_index (
    tenant TEXT NOT NULL, digest TEXT NOT NULL, decision_id TEXT NOT NULL,
    PRIMARY KEY (tenant, digest, decision_id)
);
CREATE INDEX IF NOT EXISTS retained_index_decision ON retained_index (tenant, decision_id);
CREATE TABLE IF NOT EXISTS tenant_keys (
    tenant TEXT PRIMARY KEY, key_id TEXT NOT NULL, operator_key_id TEXT NOT NULL,
    wrapped BLOB NOT NULL, created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS tenant_keys_operator ON tenant_keys (operator_key_id);
CREATE TABLE IF NOT EXISTS erasures (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, selector_kind TEXT NOT NULL, selector_digest TEXT NOT NULL,
    decisions INTEGER NOT NULL, created_at REAL NOT NULL, actor TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS erasures_tenant ON erasures (tenant, created_at);
""",
    # 7: shadow and canary candidates, the shadow's diffs and per-rule flips, and the audit log by
    # policy (a canary's health is counted from it; crossaudit.governance.rollout)
    """
CREATE TABLE candidates (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, name TEXT NOT NULL, environment TEXT NOT NULL,
    mode TEXT NOT NULL, version INTEGER NOT NULL, active_version INTEGER NOT NULL, share REAL NOT NULL,
    canary_key TEXT NOT NULL, notify_url TEXT NOT NULL, bounds TEXT NOT NULL, state TEXT NOT NULL,
    started_at REAL NOT NULL, ended_at REAL, reason TEXT NOT NULL,
    evaluated INTEGER NOT NULL, agreed INTEGER NOT NULL, pass_to_fail INTEGER NOT NULL,
    fail_to_pass INTEGER NOT NULL, action_changes INTEGER NOT NULL, errors INTEGER NOT NULL,
    dropped INTEGER NOT NULL, diffs_stored INTEGER NOT NULL
);
CREATE UNIQUE INDEX candidates_running ON candidates (tenant, name, environment) WHERE state = 'running';
CREATE INDEX candidates_key ON candidates (tenant, name, environment, started_at);
CREATE TABLE shadow_diffs (
    tenant TEXT NOT NULL, candidate_id TEXT NOT NULL, decision_id TEXT NOT NULL, created_at REAL NOT NULL,
    live_passed INTEGER NOT NULL, live_action TEXT NOT NULL, candidate_passed INTEGER NOT NULL,
    candidate_action TEXT NOT NULL, rules TEXT NOT NULL, error TEXT NOT NULL, changed INTEGER NOT NULL,
    PRIMARY KEY (candidate_id, decision_id)
);
CREATE INDEX shadow_diffs_changed ON shadow_diffs (tenant, candidate_id, changed, created_at);
CREATE TABLE shadow_rule_flips (
    tenant TEXT NOT NULL, candidate_id TEXT NOT NULL, rule TEXT NOT NULL, flips INTEGER NOT NULL,
    PRIMARY KEY (candidate_id, rule)
);
CREATE INDEX decisions_policy ON decisions (tenant, policy, environment, created_at);
""",
    # 8: an erasure finds the decision log's outbox copies of its decisions by decision id
    # (the outbox keeps delivered rows: without it, each erasure walked the tenant's outbox);
    # the purge finds a tenant's rows older than its current ceiling by creation time
    """
CREATE INDEX IF NOT EXISTS outbox_decision ON outbox (tenant, decision_id);
CREATE INDEX IF NOT EXISTS retained_inputs_created ON retained_inputs (tenant, created_at);
""",
    # 9: the decision log (docs/evidence.md): each decision's receipt, its sequence number in
    # its tenant's log and leaf hash; each log's head (sequence numbers are taken from it in the
    # writing transaction) and its signed checkpoints
    """
ALTER TABLE decisions ADD COLUMN receipt TEXT NOT NULL DEFAULT '{}';
ALTER TABLE decisions ADD COLUMN log_seq INTEGER;
ALTER TABLE decisions ADD COLUMN leaf_hash TEXT;
CREATE UNIQUE INDEX decisions_log ON decisions (tenant, log_seq);
CREATE TABLE log_heads (tenant TEXT PRIMARY KEY, size INTEGER NOT NULL);
CREATE TABLE log_checkpoints (
    tenant TEXT NOT NULL, size INTEGER NOT NULL, root TEXT NOT NULL, key_id TEXT NOT NULL,
    note TEXT NOT NULL, frontier TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (tenant, size)
);
""",
    # 10: labels from production (docs/calibration.md): a policy's resolved reviews in an
    # environment by resolution time, and a tenant's feedback by creation time (ListLabels pages)
    """
CREATE INDEX IF NOT EXISTS reviews_labels ON reviews (tenant, policy, environment, state, resolved_at);
CREATE INDEX IF NOT EXISTS feedback_created ON feedback (tenant, created_at);
""",
    # 11: the trace of each decision (docs/observability.md)
    """
ALTER TABLE decisions ADD COLUMN trace_id TEXT;
ALTER TABLE decisions ADD COLUMN span_id TEXT;
""",
)

POSTGRES: tuple[str, ...] = (
    # 1: everything SQLite's steps 1-2 hold (PostgreSQL support starts here)
    """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE policy_versions (
    tenant TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL,
    declared_version TEXT NOT NULL, digest TEXT NOT NULL, description TEXT NOT NULL,
    content TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, name, version)
);
CREATE INDEX policy_versions_digest ON policy_versions (tenant, name, digest);
CREATE TABLE deployments (
    tenant TEXT NOT NULL, name TEXT NOT NULL, environment TEXT NOT NULL,
    version INTEGER NOT NULL, deployed_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, name, environment)
);
CREATE TABLE deployment_history (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant TEXT NOT NULL, name TEXT NOT NULL, environment TEXT NOT NULL,
    version INTEGER NOT NULL, kind TEXT NOT NULL, at DOUBLE PRECISION NOT NULL
);
CREATE INDEX deployment_history_key ON deployment_history (tenant, name, environment, seq);
CREATE TABLE evaluators (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL,
    language TEXT NOT NULL, dependencies TEXT NOT NULL, digest TEXT NOT NULL,
    code TEXT NOT NULL, description TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    UNIQUE (tenant, name, version)
);
CREATE INDEX evaluators_digest ON evaluators (tenant, name, digest);
CREATE TABLE decisions (
    decision_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, policy TEXT NOT NULL,
    policy_revision INTEGER NOT NULL, policy_version TEXT NOT NULL, policy_digest TEXT NOT NULL,
    environment TEXT NOT NULL, passed INTEGER NOT NULL, action TEXT NOT NULL,
    rules TEXT NOT NULL, errored_rules TEXT NOT NULL, latency_ms DOUBLE PRECISION NOT NULL,
    prompt_sha256 TEXT NOT NULL, response_sha256 TEXT NOT NULL, context_sha256 TEXT NOT NULL,
    modified_response_sha256 TEXT, prompt TEXT, response TEXT,
    request_id TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX decisions_tenant ON decisions (tenant, created_at);
CREATE TABLE reviews (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, decision_id TEXT NOT NULL, policy TEXT NOT NULL,
    policy_revision INTEGER NOT NULL, environment TEXT NOT NULL, rule TEXT NOT NULL,
    kind TEXT NOT NULL, state TEXT NOT NULL, params TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    resolved_at DOUBLE PRECISION, reviewer TEXT NOT NULL, note TEXT NOT NULL
);
CREATE INDEX reviews_tenant ON reviews (tenant, state, created_at);
CREATE TABLE feedback (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, decision_id TEXT NOT NULL, rule TEXT NOT NULL,
    label TEXT NOT NULL, comment TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX feedback_decision ON feedback (tenant, decision_id);
CREATE TABLE outbox (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, kind TEXT NOT NULL, decision_id TEXT NOT NULL,
    rule TEXT NOT NULL, payload TEXT NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL,
    next_attempt_at DOUBLE PRECISION NOT NULL, lease_until DOUBLE PRECISION NOT NULL, last_error TEXT NOT NULL,
    last_status INTEGER NOT NULL, created_at DOUBLE PRECISION NOT NULL, delivered_at DOUBLE PRECISION
);
CREATE INDEX outbox_due ON outbox (state, kind, next_attempt_at);
CREATE INDEX outbox_tenant ON outbox (tenant, created_at);
""",
    # 2: rate_limit buckets shared by every replica (SQLite's step 3)
    """
CREATE TABLE rate_buckets (key TEXT PRIMARY KEY, tokens DOUBLE PRECISION NOT NULL, updated DOUBLE PRECISION NOT NULL);
""",
    # 3: the outbox by tenant (SQLite's step 4)
    """
CREATE INDEX outbox_tenant_due ON outbox (kind, state, tenant, next_attempt_at);
""",
    # 4: audit quotas (SQLite's step 5)
    """
ALTER TABLE decisions ADD COLUMN truncated TEXT NOT NULL DEFAULT '';
CREATE TABLE audit_usage (
    tenant TEXT NOT NULL, day INTEGER NOT NULL, writer TEXT NOT NULL, bytes BIGINT NOT NULL,
    PRIMARY KEY (tenant, day, writer)
);
""",
    # 5: retained inputs (SQLite's step 6)
    """
ALTER TABLE decisions ADD COLUMN inputs_retained_until DOUBLE PRECISION;
ALTER TABLE decisions ADD COLUMN inputs_erased_at DOUBLE PRECISION;
CREATE TABLE retained_inputs (
    tenant TEXT NOT NULL, decision_id TEXT NOT NULL, policy TEXT NOT NULL, environment TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL, key_id TEXT NOT NULL,
    nonce BYTEA NOT NULL, ciphertext BYTEA NOT NULL,
    PRIMARY KEY (tenant, decision_id)
);
CREATE INDEX retained_inputs_expiry ON retained_inputs (expires_at);
CREATE TABLE retained_index (
    tenant TEXT NOT NULL, digest TEXT NOT NULL, decision_id TEXT NOT NULL,
    PRIMARY KEY (tenant, digest, decision_id)
);
CREATE INDEX retained_index_decision ON retained_index (tenant, decision_id);
CREATE TABLE tenant_keys (
    tenant TEXT PRIMARY KEY, key_id TEXT NOT NULL, operator_key_id TEXT NOT NULL,
    wrapped BYTEA NOT NULL, created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX tenant_keys_operator ON tenant_keys (operator_key_id);
CREATE TABLE erasures (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, selector_kind TEXT NOT NULL, selector_digest TEXT NOT NULL,
    decisions INTEGER NOT NULL, created_at DOUBLE PRECISION NOT NULL, actor TEXT NOT NULL
);
CREATE INDEX erasures_tenant ON erasures (tenant, created_at);
""",
    # 6: shadow and canary candidates (SQLite's step 7)
    """
CREATE TABLE candidates (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, name TEXT NOT NULL, environment TEXT NOT NULL,
    mode TEXT NOT NULL, version INTEGER NOT NULL, active_version INTEGER NOT NULL, share DOUBLE PRECISION NOT NULL,
    canary_key TEXT NOT NULL, notify_url TEXT NOT NULL, bounds TEXT NOT NULL, state TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION, reason TEXT NOT NULL,
    evaluated INTEGER NOT NULL, agreed INTEGER NOT NULL, pass_to_fail INTEGER NOT NULL,
    fail_to_pass INTEGER NOT NULL, action_changes INTEGER NOT NULL, errors INTEGER NOT NULL,
    dropped INTEGER NOT NULL, diffs_stored INTEGER NOT NULL
);
CREATE UNIQUE INDEX candidates_running ON candidates (tenant, name, environment) WHERE state = 'running';
CREATE INDEX candidates_key ON candidates (tenant, name, environment, started_at);
CREATE TABLE shadow_diffs (
    tenant TEXT NOT NULL, candidate_id TEXT NOT NULL, decision_id TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    live_passed INTEGER NOT NULL, live_action TEXT NOT NULL, candidate_passed INTEGER NOT NULL,
    candidate_action TEXT NOT NULL, rules TEXT NOT NULL, error TEXT NOT NULL, changed INTEGER NOT NULL,
    PRIMARY KEY (candidate_id, decision_id)
);
CREATE INDEX shadow_diffs_changed ON shadow_diffs (tenant, candidate_id, changed, created_at);
CREATE TABLE shadow_rule_flips (
    tenant TEXT NOT NULL, candidate_id TEXT NOT NULL, rule TEXT NOT NULL, flips INTEGER NOT NULL,
    PRIMARY KEY (candidate_id, rule)
);
CREATE INDEX decisions_policy ON decisions (tenant, policy, environment, created_at);
""",
    # 7: the outbox by decision, for erasures; retained rows by creation (SQLite's step 8)
    """
CREATE INDEX outbox_decision ON outbox (tenant, decision_id);
CREATE INDEX retained_inputs_created ON retained_inputs (tenant, created_at);
""",
    # 8: the decision log (SQLite's step 9)
    """
ALTER TABLE decisions ADD COLUMN receipt TEXT NOT NULL DEFAULT '{}';
ALTER TABLE decisions ADD COLUMN log_seq BIGINT;
ALTER TABLE decisions ADD COLUMN leaf_hash TEXT;
CREATE UNIQUE INDEX decisions_log ON decisions (tenant, log_seq);
CREATE TABLE log_heads (tenant TEXT PRIMARY KEY, size BIGINT NOT NULL);
CREATE TABLE log_checkpoints (
    tenant TEXT NOT NULL, size BIGINT NOT NULL, root TEXT NOT NULL, key_id TEXT NOT NULL,
    note TEXT NOT NULL, frontier TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, size)
);
""",
    # 9: labels from production (SQLite's step 10)
    """
CREATE INDEX reviews_labels ON reviews (tenant, policy, environment, state, resolved_at);
CREATE INDEX feedback_created ON feedback (tenant, created_at);
""",
    # 10: the trace of each decision (docs/observability.md; SQLite's step 11)
    """
ALTER TABLE decisions ADD COLUMN trace_id TEXT;
ALTER TABLE decisions ADD COLUMN span_id TEXT;
""",
)
