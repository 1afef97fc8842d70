"""What a policy needs from where it runs to reach verdicts: the warnings and notes of
``crossaudit policy validate`` beyond the document itself.

A rule **reaches no verdict here** when every evaluator it asks cannot answer from this
environment without a network, found by the evaluators' own code, as their calls run it:

* an ``llm`` evaluator whose settings do not resolve (no API key: ``OPENAI_API_KEY`` unset, or
  the ``${VAR}`` its config names; azure without an endpoint): ``LLMEvaluator.settings()``;
* a ``builtin`` whose model is not here (explicit paths, the model store, the libraries'
  caches): the runtime's resolution in offline mode (:func:`~crossaudit.modelserver.builtins.offline_problem`).
  When offline mode is off a call downloads the model, so the rule gets no verdict *offline*.

Such a rule fails closed (its action, or ``fallback.on_error``'s: :func:`no_verdict_action`) and
the warning says so. A rule whose ``fallback.evaluator`` can answer gets no warning; a consensus
rule with some evaluators unable to answer decides without them (a fail vote each) and gets one.
Custom code is not looked at here (``policy test`` says where local results may differ).

A rule whose conditions read request context the engine does not derive (``time.*`` and
``content.length|hash`` are derived; ``previous_rule.*`` comes from the policy) applies only when
the request carries it: that is a **note**, not a warning. Choosing the requests a rule judges is
what conditions are for; the note names the fields and an example ``--context``.

Nothing here downloads, starts a model server or builds an SDK client.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from crossaudit.kernel.dsl import Condition, EvaluatorType, Operator, Policy, Rule
from crossaudit.kernel.errors import CrossAuditError
from crossaudit.kernel.yamlsafe import format_path
from crossaudit.modelserver.builtins import offline_problem
from orchestrator.engine.conditions import NEGATIVE
from orchestrator.engine.context import MISSING, build_context, lookup
from orchestrator.engine.engine import no_verdict_action
from orchestrator.evaluators.llm import LLMEvaluator

# Operators whose compared value is a sensible example of what a request carries.
_EXAMPLE_OPERATORS = {Operator.EQUALS, Operator.CONTAINS, Operator.STARTS_WITH, Operator.ENDS_WITH, Operator.IN}


@dataclass(frozen=True)
class Unready:
    """An evaluator that cannot answer here."""

    evaluator: str
    where: str  # its place in the document: "evaluators[3]" or "evaluators[3].config.entities"
    message: str  # what is missing (first line), then how to fix it
    downloadable: bool  # a call would download what is missing (offline mode off)


@dataclass
class Readiness:
    warnings: list[str] = field(default_factory=list)  # rules that reach no verdict here / offline
    notes: list[str] = field(default_factory=list)  # request context some rules need to apply


def unready_evaluators(policy: Policy, environ: Mapping[str, str] | None = None) -> dict[str, Unready]:
    """Evaluator name → why it cannot answer here (llm and builtin evaluators; see the module)."""
    out: dict[str, Unready] = {}
    for i, spec in enumerate(policy.evaluators):
        if spec is None or spec.__pydantic_private__.get("_typed") is None:
            continue  # invalid: validation reports it
        where = format_path(("evaluators", i))
        if spec.kind is EvaluatorType.LLM:
            try:
                LLMEvaluator(spec.name, spec.typed_config, environ=environ).settings()
            except CrossAuditError as e:  # as its calls would fail (a key, an endpoint)
                out[spec.name] = Unready(spec.name, where, e.message, downloadable=False)
        elif spec.kind is EvaluatorType.BUILTIN:
            problem = offline_problem(spec.typed_config, environ)
            if problem is not None:
                at = format_path(("evaluators", i, "config", problem.field)) if problem.field else where
                out[spec.name] = Unready(spec.name, at, problem.message, problem.downloadable)
    return out


def _outcome(rule: Rule) -> str:
    action, how = no_verdict_action(rule)
    if action is None:
        return how  # allowed by fallback.on_error
    return f"fails closed: {action.value}" if how.startswith("fail-closed") else f"{how}: {action.value}"


def _no_verdict_warnings(policy: Policy, unready: Mapping[str, Unready]) -> list[str]:
    lost: dict[str, list[str]] = {name: [] for name in unready}  # evaluator -> the rules it leaves without a verdict
    partial: dict[str, list[str]] = {name: [] for name in unready}  # ... and the consensus rules it leaves a vote short
    for rule in policy.rules:
        if not rule.enabled:
            continue
        names = rule.evaluator_names
        missing = [n for n in names if n in unready]
        if not missing:
            continue
        fallback = rule.fallback.evaluator if rule.fallback else None
        if len(missing) < len(names):
            for n in missing:
                partial[n].append(f"rule {rule.name!r} decides without its vote (a fail vote)")
        elif fallback is None or fallback in unready:
            for n in missing:
                lost[n].append(f"rule {rule.name!r} ({_outcome(rule)})")
    out = []
    for name, u in unready.items():
        rules = lost[name] + partial[name]
        if not rules:
            continue  # unused, or a fallback answers for it
        first, _, rest = u.message.partition("\n")
        scope = "offline" if u.downloadable else "here"
        then = " A call downloads it unless offline mode is on (CROSSAUDIT_OFFLINE=1)." if u.downloadable else ""
        text = f"no verdict {scope}: {'; '.join(rules)}: {u.where} ({name}): {first}{then}"
        out.append(text + (f"\n{rest}" if rest else ""))
    return out


def _needs(cond: Condition, derived: Mapping[str, Any]) -> bool:
    """Whether ``cond`` reads a field only the request can supply."""
    return not cond.field.startswith("previous_rule.") and lookup(derived, cond.field) is MISSING


def _example(conds: list[Condition]) -> str:
    """A ``--context`` that carries what ``conds`` compare, or "" when one has no plain example."""
    doc: dict[str, Any] = {}
    for c in conds:
        if c.operator not in _EXAMPLE_OPERATORS:
            return ""
        value = c.value[0] if c.operator is Operator.IN and isinstance(c.value, list) and c.value else c.value
        *parents, leaf = c.field.split(".")
        node = doc
        for p in parents:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                return ""
            node = nxt
        node[leaf] = value
    return f" (e.g. --context '{json.dumps(doc)}')" if doc else ""


def _context_notes(policy: Policy) -> list[str]:
    derived = build_context({}, "", timezone=policy.settings.timezone)
    groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[Rule]] = {}
    for rule in policy.rules:
        if not rule.enabled:
            continue
        conds = [c for c in rule.conditions if _needs(c, derived)]
        required = tuple(dict.fromkeys(c.field for c in conds if c.operator not in NEGATIVE))
        optional = tuple(dict.fromkeys(c.field for c in conds if c.operator in NEGATIVE and c.field not in required))
        if required or optional:
            groups.setdefault((required, optional), []).append(rule)
    enabled = sum(r.enabled for r in policy.rules)
    out = []
    for (required, optional), rules in groups.items():
        names = ", ".join(repr(r.name) for r in rules)
        who = f"rule {names}" if len(rules) == 1 else f"rules {names}"
        if required:
            example = _example([c for c in rules[0].conditions if c.field in required])
            verb, it = ("applies", "it is") if len(rules) == 1 else ("apply", "they are")
            text = (
                f"{who} {verb} only when the request's context carries {', '.join(required)}{example}; "
                f"otherwise {it} skipped"
            )
            if len(rules) == enabled and len(groups) == 1:
                text += " (every rule of the policy: such a request is allowed with no rule applied)"
        else:
            text = f"{who} read{'s' if len(rules) == 1 else ''} {', '.join(optional)} from the request's context"
            text += " (absent, a not_equals/not_in/not_contains condition holds)"
        out.append(text)
    return out


def readiness(policy: Policy, environ: Mapping[str, str] | None = None) -> Readiness:
    """The warnings (rules that reach no verdict here or offline) and notes (request context that
    rules need) of ``policy`` under ``environ`` (None: this process's environment)."""
    return Readiness(_no_verdict_warnings(policy, unready_evaluators(policy, environ)), _context_notes(policy))
