"""What a policy may not ask of the service (checked at validate/deploy, with line and column).

The service never reads a file that a policy names: a tenant must not be able to run any
``.py`` file of the server, nor learn which files exist. So ``code_file`` and builtin model
paths are refused outright — the same answer whatever the path, existing or not — and
``evaluators/<name>.py`` is never looked up (``PolicyCatalog`` in ``catalog.py`` reports a custom
evaluator without code or upload). The CLI and the Client inline ``code_file`` and
``evaluators/<name>.py`` before sending; only the local PolicyTester reads them.

LLM ``base_url`` hosts must be on the operator's allowlist (checked again at each call,
which also covers a host that only a ``${NAME}`` expansion reveals). A ``custom`` action's
``webhook_url`` must be an origin granted to the tenant, which must have a signing secret
(checked again, with DNS, at each delivery: ``crossaudit.outbox.destinations``).
"""

from __future__ import annotations

from collections.abc import Mapping

from crossaudit.kernel.dsl import CustomActionConfig, EvaluatorType, Policy
from crossaudit.kernel.errors import PolicyIssue
from crossaudit.kernel.results import Action
from crossaudit.modelserver.builtins import model_path_settings
from crossaudit.outbox.destinations import WebhookGrant
from orchestrator.policy.envvars import ENV_RE
from orchestrator.policy.validate import IssueAt, PolicyCheck
from orchestrator.secrets import HostAllowlist

CODE_FILE_REFUSED = (
    "code_file names a file on the service's machine, which the service never reads: deploy with "
    "`crossaudit policy deploy` or Client.deploy_policy (they inline the file as config.code), or give config.code"
)
# builtin config field -> the operator's setting that replaces it (each builtin's runtime names its own)
MODEL_PATH_FIELDS = model_path_settings()
_REFERENCE_MARK = "reference"  # stands in for ${NAME} in a base_url's path when it is checked at deploy


def model_path_refused(env: str) -> str:
    return (
        "this field names a file on the service's machine, which the service never reads: on the "
        f"service, models are the operator's (server setting {env})"
    )


def hosted_checks(hosts: HostAllowlist | None, webhooks: WebhookGrant | None = None) -> PolicyCheck:
    """The service's rules for one tenant; ``hosts`` None = any LLM endpoint (dev mode);
    ``webhooks`` None = webhook destinations are not checked."""

    def check(policy: Policy, issue_at: IssueAt) -> list[PolicyIssue]:
        issues: list[PolicyIssue] = []
        for i, rule in enumerate(policy.rules):
            cfg = rule.typed_action_config if rule is not None else None
            if webhooks is not None and isinstance(cfg, CustomActionConfig) and rule.action is Action.CUSTOM:
                problem = webhooks.url_problem(cfg.webhook_url)
                if problem:
                    issues.append(issue_at(("rules", i, "action_config", "webhook_url"), problem))
        for i, ev in enumerate(policy.evaluators):
            if ev is None or not isinstance(ev.config, Mapping):
                continue
            cfg, base = ev.config, ("evaluators", i, "config")
            if ev.kind is EvaluatorType.CUSTOM and "code_file" in cfg:
                issues.append(issue_at((*base, "code_file"), CODE_FILE_REFUSED))
            elif ev.kind is EvaluatorType.BUILTIN:
                for field, env in MODEL_PATH_FIELDS.items():
                    if field in cfg:
                        issues.append(issue_at((*base, field), model_path_refused(env)))
            elif ev.kind is EvaluatorType.LLM and hosts is not None:
                url = cfg.get("base_url")
                if isinstance(url, str) and url.strip():
                    problem = _deploy_time_problem(url, hosts)
                    if problem:
                        issues.append(issue_at((*base, "base_url"), problem))
        return issues

    return check


def _deploy_time_problem(url: str, hosts: HostAllowlist) -> str | None:
    """The allowlist verdict on a literal scheme and host; one that a ``${NAME}`` expansion
    builds is checked at each call instead (the value is not read at deploy)."""
    first = ENV_RE.search(url)
    if first is not None:
        start = url.find("://") + 3 if "://" in url else 0
        end = url.find("/", start)
        if first.start() < (len(url) if end < 0 else end):
            return None
    return hosts.url_problem(ENV_RE.sub(_REFERENCE_MARK, url))
