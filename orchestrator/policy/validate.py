"""Load and validate a policy: every problem of a file, each with file:line:col and field path.

Three passes, all of which run so that one report lists everything:
1. the document models (pydantic), with did-you-mean for misspelled keys;
2. per-type evaluator ``config`` and per-action ``action_config``;
3. semantic checks: references, duplicates, operators/values, regex, CIDR, rule chaining
   (unknown, later, disabled, other stage, cyclic), rules that can never run, ``${ENV}`` variables.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import os
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path as FsPath
from typing import Any

from pydantic import BaseModel, ValidationError

# Pure input checks shared with evaluator uploads (stdlib + packaging only: no runners).
from crossaudit.kernel.codecheck import check_code
from crossaudit.kernel.depspec import validate_dependencies
from crossaudit.kernel.dsl import (
    ACTION_CONFIGS,
    BUILTIN_MODELS,
    DEFAULT_LLM_MODEL,
    RULE_STAGES,
    TEMPLATE_FIELDS,
    TEMPLATE_RE,
    CustomConfig,
    EvaluatorType,
    LLMConfig,
    ModifyStrategy,
    Operator,
    Policy,
    Rule,
    Stage,
)
from crossaudit.kernel.errors import DependencyRejectedError, EvaluatorCodeError, PolicyIssue, PolicyValidationError
from crossaudit.kernel.limits import PolicyLimits
from crossaudit.kernel.results import Action
from crossaudit.kernel.yamlsafe import Path, SourceMap, format_path, load_yaml
from orchestrator.policy import envvars
from orchestrator.policy.regex import RegexError, compile_pattern
from orchestrator.secrets import SecretSource, as_secret_source

IssueAt = Callable[[Path, str], PolicyIssue]  # (field path, message) -> a located issue
PolicyCheck = Callable[[Policy, IssueAt], list[PolicyIssue]]  # a caller's extra rule (see load_policy)


def load_policy(
    text: str,
    filename: str = "<policy>",
    *,
    limits: PolicyLimits | None = None,
    env: Mapping[str, str] | SecretSource | None = None,
    checks: Sequence[PolicyCheck] = (),
) -> Policy:
    """Parse and validate policy YAML text. Raises PolicyValidationError listing all issues.

    ``env`` is where ``${NAME}`` references may point (a mapping or None = the process
    environment: unset names are warnings; a strict source such as a tenant's grants: names it
    does not grant are errors). ``checks`` are extra rules of the caller (the service's), run
    with a locator so that their issues carry line and column like every other issue.
    """
    limits = limits or PolicyLimits()
    data, smap = load_yaml(text, filename, limits)
    issues: list[PolicyIssue] = []
    if not isinstance(data, dict):
        raise PolicyValidationError([smap.issue((), "a policy must be a YAML mapping with name, description, ...")])

    policy: Policy | None = None
    try:
        policy = Policy.model_validate(data)
    except ValidationError as e:
        issues.extend(_pydantic_issues(e, Policy, (), smap))
    partial = policy if policy is not None else _partial_policy(data)

    issues.extend(_check_evaluator_configs(data, smap, partial))
    issues.extend(_check_action_configs(data, smap, partial))
    warnings: list[str] = []
    issues.extend(_semantic_checks(partial, smap, limits, warnings, as_secret_source(env)))
    issues.extend(_check_conditions(data, smap, limits))
    for check in checks:
        issues.extend(check(partial, smap.issue))
    if issues:
        raise PolicyValidationError(_dedupe(issues))
    assert policy is not None
    policy._source_path = None if filename.startswith("<") else filename
    policy._warnings = warnings
    policy._digest = hashlib.sha256(text.encode()).hexdigest()
    return policy


def load_policy_file(
    path: str | os.PathLike[str],
    *,
    limits: PolicyLimits | None = None,
    env: Mapping[str, str] | SecretSource | None = None,
    checks: Sequence[PolicyCheck] = (),
) -> Policy:
    """Read and validate a policy file (size-checked before it is read); ``checks`` as in load_policy."""
    limits = limits or PolicyLimits()
    p = FsPath(path)
    name = str(path)
    try:
        size = p.stat().st_size
        if not p.is_file():
            raise PolicyValidationError([PolicyIssue(message="not a regular file", file=name)])
        if size > limits.max_file_bytes:
            raise PolicyValidationError(
                [PolicyIssue(message=f"policy file larger than {limits.max_file_bytes} bytes", file=name)]
            )
        raw = p.read_bytes()
    except FileNotFoundError:
        raise PolicyValidationError([PolicyIssue(message="file not found", file=name)]) from None
    except OSError as e:
        raise PolicyValidationError([PolicyIssue(message=f"cannot read file: {e.strerror}", file=name)]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PolicyValidationError([PolicyIssue(message=f"not UTF-8 text (byte {e.start})", file=name)]) from None
    policy = load_policy(text, name, limits=limits, env=env, checks=checks)
    policy._source_path = str(p.resolve())
    return policy


def _partial_policy(data: dict[str, Any]) -> Policy:
    """The valid parts of an invalid document, so later passes still report their issues.

    Invalid evaluators/rules become None placeholders so indices (and paths) stay right.
    """

    def each(key: str, model: type[BaseModel]) -> list[Any]:
        items = data.get(key)
        out: list[Any] = []
        for item in items if isinstance(items, list) else []:
            out.append(_salvage(model, item))
        return out

    from crossaudit.kernel.dsl import EvaluatorSpec, PolicySettings, TestCase

    try:
        settings = PolicySettings.model_validate(data.get("settings") or {})
    except ValidationError:
        settings = PolicySettings()
    return Policy.model_construct(
        name=str(data.get("name", "")),
        description="",
        version="0",
        evaluators=each("evaluators", EvaluatorSpec),
        rules=each("rules", Rule),
        test_cases=each("test_cases", TestCase),
        settings=settings,
    )


def _salvage(model: type[BaseModel], item: Any) -> Any:
    """Validate ``item``, dropping the top-level keys that fail (a few rounds), or None."""
    if not isinstance(item, dict):
        return None
    item = dict(item)
    for _ in range(4):
        try:
            return model.model_validate(item)
        except ValidationError as e:
            bad = {err["loc"][0] for err in e.errors() if err["loc"]}
            required = {k for k, f in model.model_fields.items() if f.is_required()}
            if not bad or bad & required:
                return None
            for key in bad:
                item.pop(key, None)
    return None


# --- pass 1: pydantic errors -> issues ----------------------------------------------------


def _pydantic_issues(err: ValidationError, model: type[BaseModel], prefix: Path, smap: SourceMap) -> list[PolicyIssue]:
    out: list[PolicyIssue] = []
    for e in err.errors(include_url=False):
        loc = tuple(x for x in e["loc"] if not _is_union_tag(x))
        path: Path = (*prefix, *loc)
        kind = e["type"]
        if kind == "extra_forbidden":
            key = str(loc[-1]) if loc else ""
            owner = _model_at(model, loc[:-1])
            hint = _did_you_mean(key, list(owner.model_fields) if owner else [])
            out.append(smap.issue(path, f"unknown field {key!r}{hint}", key=True))
        elif kind == "missing":
            out.append(smap.issue(path[:-1], f"missing required field {str(loc[-1])!r}"))
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if kind == "literal_error" or kind == "enum":
                got = e.get("input")
                expected = e.get("ctx", {}).get("expected", "")
                opts = re.findall(r"'([^']+)'", str(expected))
                msg = f"{msg}, got {got!r}{_did_you_mean(str(got), opts)}"
            elif kind == "string_pattern_mismatch" and loc and loc[-1] == "version":
                msg = f"version must be semantic (e.g. 1.0 or 2.1.3), got {e.get('input')!r}"
            elif kind.startswith(("less_than", "greater_than")):
                msg = f"{msg}, got {e.get('input')!r}"
            out.append(smap.issue(path, msg))
    return out


def _is_union_tag(part: Any) -> bool:
    # pydantic inserts union member names ('float', "literal['dynamic']") into locs.
    return isinstance(part, str) and (
        part in {"float", "int", "str", "bool"} or part.startswith(("literal[", "function-"))
    )


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns the mapping at ``loc`` (for did-you-mean suggestions)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return None
        current = _unwrap(current.model_fields[part].annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    for _ in range(6):
        origin = typing.get_origin(tp)
        if origin is typing.Annotated or origin in (list, tuple, set):
            tp = typing.get_args(tp)[0]
        elif origin is dict:
            tp = typing.get_args(tp)[1]
        elif origin in (typing.Union, types.UnionType):
            models = [a for a in typing.get_args(tp) if isinstance(a, type) and issubclass(a, BaseModel)]
            others = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = models[0] if models else (others[0] if others else tp)
        else:
            break
    return tp


def _did_you_mean(word: str, options: list[str], cutoff: float = 0.6) -> str:
    match = difflib.get_close_matches(word, options, n=1, cutoff=cutoff)
    return f" (did you mean {match[0]!r}?)" if match else ""


# --- pass 2: typed configs ------------------------------------------------------------------


def _infer_type(raw: Mapping[str, Any]) -> EvaluatorType | None:
    cfg: dict[str, Any] = raw["config"] if isinstance(raw.get("config"), dict) else {}
    if raw.get("id"):
        return EvaluatorType.CUSTOM
    if "provider" in cfg:
        return EvaluatorType.LLM
    if cfg.get("model") in BUILTIN_MODELS:
        return EvaluatorType.BUILTIN
    if {"code", "code_file", "dependencies"} & set(cfg):
        return EvaluatorType.CUSTOM
    return None


def _check_evaluator_configs(data: dict[str, Any], smap: SourceMap, policy: Policy | None) -> list[PolicyIssue]:
    issues: list[PolicyIssue] = []
    evaluators = data.get("evaluators")
    if not isinstance(evaluators, list):
        return issues
    for i, raw in enumerate(evaluators):
        if not isinstance(raw, dict):
            continue
        path: Path = ("evaluators", i, "config")
        cfg = raw.get("config", {})
        if cfg is None:
            cfg = {}
        if not isinstance(cfg, dict):
            continue  # pass 1 reported it
        declared = raw.get("type")
        try:
            etype = EvaluatorType(declared) if declared is not None else _infer_type(raw)
        except ValueError:
            continue  # pass 1 reported the bad enum
        if etype is None:
            issues.append(smap.issue(("evaluators", i), "missing required field 'type' (llm, custom or builtin)"))
            continue
        model: type[BaseModel]
        if etype is EvaluatorType.LLM:
            model = LLMConfig
        elif etype is EvaluatorType.CUSTOM:
            model = CustomConfig
            for key in cfg:
                if key not in CustomConfig.model_fields:
                    # Extra keys are parameters for the code; only near-certain typos are errors.
                    hint = _did_you_mean(key, list(CustomConfig.model_fields), cutoff=0.85)
                    if hint:
                        issues.append(smap.issue((*path, key), f"unknown field {key!r}{hint}", key=True))
        else:
            name = cfg.get("model")
            if name not in BUILTIN_MODELS:
                hint = _did_you_mean(str(name), list(BUILTIN_MODELS))
                issues.append(
                    smap.issue(
                        (*path, "model"), f"builtin model must be one of {sorted(BUILTIN_MODELS)}, got {name!r}{hint}"
                    )
                )
                continue
            model = BUILTIN_MODELS[name]
        try:
            typed = model.model_validate(cfg)
        except ValidationError as e:
            issues.extend(_pydantic_issues(e, model, path, smap))
            continue
        if isinstance(typed, CustomConfig):
            if typed.code is not None and typed.code_file is not None:
                issues.append(smap.issue(path, "give either 'code' or 'code_file', not both"))
            if typed.code is not None:
                problem = check_evaluator_code(typed.code)
                if problem:
                    issues.append(smap.issue((*path, "code"), problem))
            issues.extend(_check_dependencies(typed.dependencies, (*path, "dependencies"), smap))
        if policy is not None and i < len(policy.evaluators) and policy.evaluators[i] is not None:
            spec = policy.evaluators[i]
            spec._typed = typed  # type: ignore[assignment]
            if spec.type is None:
                spec.type = etype
    return issues


def check_evaluator_code(code: str) -> str | None:
    """Why ``code`` cannot be a custom evaluator, or None. Parsing only: nothing runs."""
    try:
        check_code(code)
    except EvaluatorCodeError as e:
        return e.message
    return None


def _check_dependencies(deps: list[str], path: Path, smap: SourceMap) -> list[PolicyIssue]:
    try:
        validate_dependencies(deps)
    except DependencyRejectedError as e:
        return [smap.issue(path, e.message)]
    return []


def _check_action_configs(data: dict[str, Any], smap: SourceMap, policy: Policy | None) -> list[PolicyIssue]:
    issues: list[PolicyIssue] = []
    rules = data.get("rules")
    if not isinstance(rules, list):
        return issues
    for i, raw in enumerate(rules):
        if not isinstance(raw, dict):
            continue
        try:
            action = Action(raw.get("action", Action.BLOCK.value))
        except ValueError:
            continue  # pass 1 reported it
        cfg = raw.get("action_config") or {}
        if not isinstance(cfg, dict):
            continue
        model = ACTION_CONFIGS[action]
        path: Path = ("rules", i, "action_config")
        try:
            typed = model.model_validate(cfg)
        except ValidationError as e:
            issues.extend(_pydantic_issues(e, model, path, smap))
            continue
        if action is Action.CUSTOM:
            issues.extend(_check_templates(getattr(typed, "payload", {}), (*path, "payload"), smap))
        strategy = getattr(typed, "strategy", None)
        at_tool_call = raw.get("stage") == Stage.TOOL_CALL.value
        if action is Action.MODIFY and at_tool_call and strategy is not ModifyStrategy.REDACT:
            # a tool call's arguments stay valid JSON only when findings are redacted inside their values
            issues.append(
                smap.issue(
                    (*path, "strategy") if "strategy" in cfg else ("rules", i, "action"),
                    f"a tool_call rule's modify can only redact (strategy redact): {strategy} would not leave the "
                    "tool call's arguments valid JSON",
                )
            )
        if policy is not None and i < len(policy.rules) and policy.rules[i] is not None:
            policy.rules[i]._typed_action = typed
    return issues


def _check_templates(value: Any, path: Path, smap: SourceMap) -> list[PolicyIssue]:
    out: list[PolicyIssue] = []
    if isinstance(value, str):
        for m in TEMPLATE_RE.finditer(value):
            if m.group(1) not in TEMPLATE_FIELDS:
                hint = _did_you_mean(m.group(1), sorted(TEMPLATE_FIELDS))
                out.append(smap.issue(path, f"unknown template field {{{{{m.group(1)}}}}}{hint}"))
    elif isinstance(value, dict):
        for k, v in value.items():
            out.extend(_check_templates(v, (*path, k), smap))
    elif isinstance(value, list):
        for j, v in enumerate(value):
            out.extend(_check_templates(v, (*path, j), smap))
    return out


# --- pass 3: semantics ---------------------------------------------------------------------


# Long: the semantic checks of a policy, one after another in the guide's order, each adding its
# issues; every check is a few lines, and their order is the order of the issues a user reads.
def _semantic_checks(
    policy: Policy, smap: SourceMap, limits: PolicyLimits, warnings: list[str], secrets: SecretSource
) -> list[PolicyIssue]:
    issues: list[PolicyIssue] = []
    if len(policy.rules) > limits.max_rules:
        issues.append(smap.issue(("rules",), f"too many rules ({len(policy.rules)} > {limits.max_rules})"))
    if len(policy.evaluators) > limits.max_evaluators:
        issues.append(smap.issue(("evaluators",), f"too many evaluators (limit {limits.max_evaluators})"))

    evaluator_names: dict[str, int] = {}
    for i, ev in enumerate(policy.evaluators):
        if ev is None:
            continue
        if ev.name in evaluator_names:
            issues.append(smap.issue(("evaluators", i, "name"), f"duplicate evaluator name {ev.name!r}"))
        else:
            evaluator_names[ev.name] = i
    rule_index: dict[str, int] = {}
    for i, rule in enumerate(policy.rules):
        if rule is None:
            continue
        if rule.name in rule_index:
            issues.append(smap.issue(("rules", i, "name"), f"duplicate rule name {rule.name!r}"))
        else:
            rule_index[rule.name] = i
    case_names: set[str] = set()
    for i, case in enumerate(policy.test_cases):
        if case is None:
            continue
        if case.name in case_names:
            issues.append(smap.issue(("test_cases", i, "name"), f"duplicate test case name {case.name!r}"))
        case_names.add(case.name)

    known = list(evaluator_names)
    used: set[str] = set()
    for i, rule in enumerate(policy.rules):
        if rule is None:
            continue
        rp: Path = ("rules", i)
        if rule.evaluator and rule.evaluators:
            issues.append(smap.issue(rp, "give either 'evaluator' or 'evaluators', not both"))
        elif not rule.evaluator and not rule.evaluators:
            issues.append(smap.issue(rp, "a rule needs 'evaluator' (or 'evaluators' for consensus)"))
        refs: list[tuple[Path, str]] = []
        if rule.evaluator:
            refs.append(((*rp, "evaluator"), rule.evaluator))
        for j, we in enumerate(rule.evaluators or []):
            refs.append(((*rp, "evaluators", j, "name"), we.name))
        if rule.fallback and rule.fallback.evaluator:
            refs.append(((*rp, "fallback", "evaluator"), rule.fallback.evaluator))
            if rule.fallback.evaluator == rule.evaluator:
                warnings.append(f"rules[{i}] {rule.name}: fallback evaluator is the primary evaluator")
        for path, name in refs:
            used.add(name)
            if name not in evaluator_names:
                issues.append(
                    smap.issue(
                        path,
                        f"undefined evaluator {name!r}{_did_you_mean(name, known)} "
                        "(define it in the evaluators section)",
                    )
                )
        if rule.evaluators:
            names = [e.name for e in rule.evaluators]
            if len(set(names)) != len(names):
                issues.append(smap.issue((*rp, "evaluators"), "an evaluator is listed twice in this rule"))
        elif rule.consensus_strategy is not None:
            issues.append(smap.issue((*rp, "consensus_strategy"), "consensus_strategy needs 'evaluators' (several)"))
        if rule.on_disagreement is not None and len(rule.evaluators or []) < 2:
            issues.append(
                smap.issue(
                    (*rp, "on_disagreement"),
                    "on_disagreement needs 'evaluators' (two or more): one evaluator cannot disagree with itself",
                )
            )
        if rule.threshold == "dynamic" and rule.threshold_config is None:
            issues.append(smap.issue((*rp, "threshold"), "threshold 'dynamic' needs threshold_config"))
        if rule.threshold != "dynamic" and rule.threshold_config is not None:
            issues.append(smap.issue((*rp, "threshold_config"), "threshold_config needs threshold: 'dynamic'"))
        if rule.fallback and rule.fallback.evaluator is None and rule.fallback.on_error is None:
            issues.append(smap.issue((*rp, "fallback"), "fallback needs 'evaluator' and/or 'on_error'"))
        issues.extend(_contradictions(rule, rp, smap))

    for ev in policy.evaluators:
        if ev is not None and ev.kind is EvaluatorType.LLM and "model" not in ev.config:
            warnings.append(f"evaluator {ev.name!r}: no model given, using {DEFAULT_LLM_MODEL}")
    if not policy.rules:
        warnings.append("the policy has no rules: every request passes")
    for name in evaluator_names:
        if name not in used:
            warnings.append(f"evaluator {name!r} is defined but no rule uses it")

    issues.extend(_check_chaining(policy, rule_index, smap))
    issues.extend(_check_references(policy, smap, secrets, warnings))
    return issues


def _check_conditions(data: dict[str, Any], smap: SourceMap, limits: PolicyLimits) -> list[PolicyIssue]:
    """Every condition's value against its operator, read from the document itself: a rule with
    one bad condition (say an unknown operator) still gets its other conditions checked, so every
    problem of a file is reported at once."""
    issues: list[PolicyIssue] = []
    rules = data.get("rules")
    for i, rule in enumerate(rules if isinstance(rules, list) else []):
        conditions = rule.get("conditions") if isinstance(rule, dict) else None
        for j, cond in enumerate(conditions if isinstance(conditions, list) else []):
            if not isinstance(cond, dict) or not isinstance(cond.get("field"), str):
                continue
            try:
                op = Operator(cond.get("operator"))
            except ValueError:
                continue  # the model pass reports the operator itself
            issues.extend(
                _check_condition(cond["field"], op, cond.get("value"), ("rules", i, "conditions", j), smap, limits)
            )
    return issues


def _check_condition(
    field: str, op: Operator, value: Any, path: Path, smap: SourceMap, limits: PolicyLimits
) -> list[PolicyIssue]:
    vpath = (*path, "value")
    if op in (Operator.IN, Operator.NOT_IN):
        if not isinstance(value, list):
            return [smap.issue(vpath, f"operator {op.value!r} needs a list value")]
        out = []
        for k, item in enumerate(value):
            if isinstance(item, str) and "/" in item and _looks_like_ip(item.split("/")[0]):
                try:
                    ipaddress.ip_network(item, strict=False)
                except ValueError:
                    out.append(smap.issue((*vpath, k), f"invalid CIDR range {item!r}"))
            elif (
                isinstance(item, str)
                and field.split(".")[-1] in {"ip", "ip_address", "client_ip"}
                and _looks_like_ip(item)
            ):
                try:
                    ipaddress.ip_address(item)
                except ValueError:
                    out.append(smap.issue((*vpath, k), f"invalid IP address {item!r}"))
        return out
    if op in (Operator.GREATER_THAN, Operator.LESS_THAN):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return [smap.issue(vpath, f"operator {op.value!r} needs a number, got {value!r}")]
        return []
    if op in (Operator.CONTAINS, Operator.NOT_CONTAINS, Operator.STARTS_WITH, Operator.ENDS_WITH):
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            return [smap.issue(vpath, f"operator {op.value!r} needs a string value")]
        return []
    if op is Operator.REGEX_MATCH:
        if not isinstance(value, str):
            return [smap.issue(vpath, "regex_match needs a string pattern")]
        if len(value) > limits.max_regex_length:
            return [smap.issue(vpath, f"regex longer than {limits.max_regex_length} characters")]
        try:
            compile_pattern(value)
        except RegexError as e:
            return [smap.issue(vpath, f"invalid regular expression ({e}); RE2 syntax: no backreferences or lookaround")]
    return []


def _looks_like_ip(s: str) -> bool:
    return bool(re.fullmatch(r"[0-9.]+|[0-9A-Fa-f:]+:[0-9A-Fa-f:.]*", s))


def _contradictions(rule: Rule, rp: Path, smap: SourceMap) -> list[PolicyIssue]:
    """Conditions on one field that no value can satisfy together: the rule can never run."""
    by_field: dict[str, list[tuple[Operator, Any]]] = {}
    for c in rule.conditions:
        by_field.setdefault(c.field, []).append((c.operator, c.value))
    out: list[PolicyIssue] = []
    for field, conds in by_field.items():
        equals = {repr(v) for op, v in conds if op is Operator.EQUALS}
        reason = None
        if len(equals) > 1:
            reason = f"{field} cannot equal two different values"
        for op, v in conds:
            if equals and op is Operator.NOT_EQUALS and repr(v) in equals:
                reason = f"{field} must both equal and not equal {v!r}"
            if equals and op is Operator.IN and isinstance(v, list) and not any(repr(x) in equals for x in v):
                reason = f"{field} equals a value outside its 'in' list"
            if equals and op is Operator.NOT_IN and isinstance(v, list) and any(repr(x) in equals for x in v):
                reason = f"{field} equals a value of its 'not_in' list"
        gts = [v for op, v in conds if op is Operator.GREATER_THAN and isinstance(v, int | float)]
        lts = [v for op, v in conds if op is Operator.LESS_THAN and isinstance(v, int | float)]
        if gts and lts and max(gts) >= min(lts):
            reason = f"{field} cannot be > {max(gts)} and < {min(lts)}"
        if reason:
            out.append(smap.issue((*rp, "conditions"), f"rule can never run: {reason}"))
    return out


def _check_chaining(policy: Policy, rule_index: dict[str, int], smap: SourceMap) -> list[PolicyIssue]:
    """previous_rule references: known, enabled, not lower priority, no cycles."""
    issues: list[PolicyIssue] = []
    names = list(rule_index)
    graph: dict[str, list[str]] = {}
    for i, rule in enumerate(policy.rules):
        if rule is None:
            continue
        graph[rule.name] = []
        for j, cond in enumerate(rule.conditions):
            parts = cond.field.split(".")
            if parts[0] != "previous_rule":
                continue
            path: Path = ("rules", i, "conditions", j, "field")
            if len(parts) < 3:
                issues.append(smap.issue(path, "use previous_rule.<rule>.<field> (e.g. previous_rule.check.score)"))
                continue
            ref = parts[1]
            if ref not in rule_index:
                issues.append(smap.issue(path, f"unknown rule {ref!r}{_did_you_mean(ref, names)}"))
                continue
            if ref == rule.name:
                issues.append(smap.issue(path, "a rule cannot read its own result"))
                continue
            other = policy.rules[rule_index[ref]]
            if not other.enabled and rule.enabled:
                issues.append(smap.issue(path, f"rule can never run: it reads disabled rule {ref!r}"))
            elif not RULE_STAGES[rule.stage] <= RULE_STAGES[other.stage]:
                # At a stage where the rule read is skipped, this rule's condition would see nothing.
                missing = min(RULE_STAGES[rule.stage] - RULE_STAGES[other.stage])
                tools = (Stage.TOOL_CALL, Stage.TOOL_RESULT)
                if other.stage is Stage.BOTH:
                    where = "applies only at the input and output stages (stage both)"
                else:
                    where = f"applies only at the {other.stage.value} stage"
                if rule.stage in tools:
                    fix = f"give {ref!r} stage {rule.stage.value}"
                elif other.stage in tools:
                    fix = f"give this rule stage {other.stage.value}"
                else:
                    fix = f"give {ref!r} stage both, or this rule stage {other.stage.value}"
                issues.append(
                    smap.issue(
                        path,
                        f"rule {ref!r} {where}, so this rule (stage {rule.stage.value}) would read nothing at the "
                        f"{missing} stage: {fix}",
                    )
                )
            elif other.priority < rule.priority:
                issues.append(
                    smap.issue(
                        path,
                        f"rule {ref!r} (priority {other.priority}) cannot run before this rule "
                        f"(priority {rule.priority}); give it a higher priority",
                    )
                )
            graph[rule.name].append(ref)
    # cycles (possible among equal priorities)
    state: dict[str, int] = {}

    def visit(n: str, stack: list[str]) -> None:
        state[n] = 1
        for m in graph.get(n, []):
            if state.get(m) == 1:
                cycle = [*stack[stack.index(m) :], m] if m in stack else [n, m]
                issues.append(
                    smap.issue(("rules", rule_index[n], "conditions"), "previous_rule cycle: " + " -> ".join(cycle))
                )
            elif state.get(m) is None:
                visit(m, [*stack, m])
        state[n] = 2

    for n in graph:
        if state.get(n) is None:
            visit(n, [n])
    return issues


def _check_references(
    policy: Policy, smap: SourceMap, secrets: SecretSource, warnings: list[str]
) -> list[PolicyIssue]:
    """``${NAME}`` in expanded fields: a name a strict source (a tenant's grants) does not grant
    is an error at its location; an unset environment variable is a warning. Never a value."""
    issues: list[PolicyIssue] = []
    unset: set[str] = set()
    for path, name in envvars.locate(policy):
        if secrets.granted(name):
            continue
        if secrets.strict:
            issues.append(
                smap.issue(
                    path,
                    f"{secrets.kind} {name} is not granted to this tenant (the operator grants secrets "
                    "per tenant in the API-keys file)",
                )
            )
        else:
            unset.add(name)
    for name in sorted(unset):
        warnings.append(f"{secrets.kind} {name} is not set (needed at evaluation time)")
    return issues


def _dedupe(issues: list[PolicyIssue]) -> list[PolicyIssue]:
    seen: set[tuple[Any, ...]] = set()
    out = []
    for i in issues:
        key = (i.path, i.message, i.line, i.column)
        if key not in seen:
            seen.add(key)
            out.append(i)
    return sorted(out, key=lambda i: (i.line or 0, i.column or 0))


__all__ = ["check_evaluator_code", "format_path", "load_policy", "load_policy_file"]
