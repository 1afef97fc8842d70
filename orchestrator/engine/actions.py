"""What a failed rule's action produces: a structured ActionOutcome, and response edits.

- block: message, error_code, http_status; warn: message, log_level; flag: severity,
  assignee, escalation time; require_review: reviewer_role and due/auto-approve times;
  custom: the webhook request rendered from its templates (``${ENV}`` headers are left
  unexpanded here and expanded only by ``webhook_request`` when sending);
- modify: ``redact`` replaces the spans evaluators located (e.g. Presidio PII) or, when
  none are given, the violation strings found in the response; ``replace`` swaps the
  whole response; ``summarize`` keeps only the sentences without findings
  (``preserve_meaning: true`` keeps them, redacted). ``replacement_text`` may use
  ``{label}`` for the finding's type, e.g. ``[{label}]``.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

from crossaudit.kernel.dsl import (
    TEMPLATE_RE,
    ActionConfigBase,
    CustomActionConfig,
    ModifyConfig,
    ModifyStrategy,
    Rule,
)
from crossaudit.kernel.results import Action, ActionOutcome, RuleResult, Span
from orchestrator import reviews
from orchestrator.policy import envvars


def render_template(value: Any, fields: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return TEMPLATE_RE.sub(lambda m: str(fields.get(m.group(1), m.group(0))), value)
    if isinstance(value, dict):
        return {k: render_template(v, fields) for k, v in value.items()}
    if isinstance(value, list):
        return [render_template(v, fields) for v in value]
    return value


def build_outcome(
    rule: Rule,
    result: RuleResult,
    action: Action,
    *,
    fields: Mapping[str, Any],
    now: dt.datetime,
    config: ActionConfigBase | None = None,
) -> ActionOutcome:
    """``config``: the parameters of an action other than the rule's own (a split vote's review)."""
    cfg: ActionConfigBase | None = config or (rule.typed_action_config if action is rule.action else None)
    params: dict[str, Any] = {}
    if cfg is not None:
        params = cfg.model_dump(mode="json", exclude_none=True, exclude={"action", "min_spread"})
        if config is not None:
            params["disagreement"] = result.reason
        params.pop("notify_admins", None) if not getattr(cfg, "notify_admins", False) else None
    if action is Action.BLOCK:
        params.setdefault("message", f"Content blocked by rule {rule.name}")
        params.setdefault("http_status", 403)
    elif action is Action.WARN:
        params.setdefault("message", f"Content may violate rule {rule.name}")
        params.setdefault("log_level", "warning")
    elif action is Action.FLAG:
        params.setdefault("severity", "medium")
        params.update(reviews.deadlines(action, params, now))
    elif action is Action.REQUIRE_REVIEW:
        params.update(reviews.deadlines(action, params, now))
    elif action is Action.CUSTOM and isinstance(cfg, CustomActionConfig):
        params["payload"] = render_template(cfg.payload, fields)
        params["request"] = {"url": cfg.webhook_url, "method": cfg.method, "headers": dict(cfg.headers)}
    return ActionOutcome(rule=rule.name, action=action, params=params)


def webhook_request(outcome: ActionOutcome, env: Mapping[str, str]) -> dict[str, Any]:
    """The sendable webhook request: headers with ``${ENV}`` expanded (never logged)."""
    req = dict(outcome.params["request"])
    req["headers"] = envvars.expand(req["headers"], env)
    req["json"] = outcome.params.get("payload", {})
    return req


# --- response modification -------------------------------------------------------------------

_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*\s*|\n")


def findings(result: RuleResult, response: str) -> list[Span]:
    """Spans located by the rule's evaluators, else occurrences of violation strings."""
    spans: list[Span] = []
    for ev in result.evaluators:
        spans.extend(s for s in ev.spans if s.end <= len(response) and s.start < s.end)
    if spans:
        return spans
    lowered = response.lower()
    for ev in result.evaluators:
        for word in ev.violations:
            w = word.strip().lower()
            if not w or len(w) > 200:
                continue
            start = lowered.find(w)
            for _ in range(1000):  # bounded: at most 1000 occurrences per term
                if start < 0:
                    break
                spans.append(Span(start=start, end=start + len(w), label="violation"))
                start = lowered.find(w, start + len(w))
    return spans


def _merge(spans: list[tuple[Span, str]]) -> list[tuple[Span, str]]:
    out: list[tuple[Span, str]] = []
    for span, text in sorted(spans, key=lambda x: (x[0].start, -x[0].end)):
        if out and span.start < out[-1][0].end:
            prev, ptext = out[-1]
            out[-1] = (Span(start=prev.start, end=max(prev.end, span.end), label=prev.label, score=prev.score), ptext)
        else:
            out.append((span, text))
    return out


def _redact(response: str, spans: list[tuple[Span, str]]) -> str:
    out = response
    for span, replacement in reversed(_merge(spans)):
        out = out[: span.start] + replacement.replace("{label}", span.label) + out[span.end :]
    return out


def redactions(response: str, edits: list[tuple[ModifyConfig, RuleResult]]) -> list[tuple[Span, str]]:
    """Every finding of the failed ``modify`` rules with its replacement text: what a tool call's
    arguments are redacted with (only ``redact`` may modify them: the validator's rule)."""
    return [(span, cfg.replacement_text) for cfg, result in edits for span in findings(result, response)]


def apply_modifications(response: str, edits: list[tuple[ModifyConfig, RuleResult]]) -> str | None:
    """The modified response for all failed ``modify`` rules (None when nothing to modify)."""
    if not edits:
        return None
    for cfg, _ in edits:
        if cfg.strategy is ModifyStrategy.REPLACE:
            return cfg.replacement_text
    redactions: list[tuple[Span, str]] = []
    drops: list[Span] = []
    for cfg, result in edits:
        for span in findings(result, response):
            if cfg.strategy is ModifyStrategy.SUMMARIZE and not cfg.preserve_meaning:
                drops.append(span)
            else:
                redactions.append((span, cfg.replacement_text))
    if not drops:
        return _redact(response, redactions)
    kept: list[str] = []
    for m in _SENTENCE.finditer(response):
        s, e = m.span()
        if any(sp.start < e and sp.end > s for sp in drops):
            continue
        local = [
            (Span(start=sp.start - s, end=sp.end - s, label=sp.label), text)
            for sp, text in redactions
            if sp.start >= s and sp.end <= e
        ]
        kept.append(_redact(response[s:e], local))
    return "".join(kept).strip() or edits[0][0].replacement_text
