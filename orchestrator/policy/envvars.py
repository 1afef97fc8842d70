"""``${NAME}`` references in policies: THE one expander (found at validation, expanded at call time).

Where values come from is a :class:`~orchestrator.secrets.SecretSource`: the local environment
for ``PolicyTester`` and ``serve --dev``, the operator's per-tenant grants for the service. A
value is never printed or stored: errors name the reference, not its content, and every value
expanded for a call is recorded in its :class:`~orchestrator.secrets.SecretUse` for masking.

Which fields are expanded (:func:`locate`): a custom evaluator's parameters (the config keys
its code receives), an llm evaluator's ``api_key``, ``base_url`` and ``organization``, a
builtin's whole config, and a custom action's webhook ``headers``. ``${...}`` anywhere else
(inline code, prompts, messages) is plain text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from crossaudit.kernel.errors import ConfigurationError
from orchestrator.secrets import SecretSource, SecretUse, as_secret_source

if TYPE_CHECKING:
    from crossaudit.kernel.dsl import Policy

ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
LLM_EXPANDED_FIELDS = ("api_key", "base_url", "organization")
CUSTOM_CONFIG_FIELDS = frozenset({"language", "dependencies", "code", "code_file", "rate_limit", "timeout"})

Path = tuple[str | int, ...]


def references(value: Any) -> set[str]:
    """Every variable name referenced anywhere inside ``value``."""
    return {name for _path, name in _walk(value, ())}


def _walk(value: Any, path: Path) -> Iterator[tuple[Path, str]]:
    if isinstance(value, str):
        for name in ENV_RE.findall(value):
            yield path, name
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _walk(v, (*path, k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _walk(v, (*path, i))


def locate(policy: Policy) -> list[tuple[Path, str]]:
    """(field path, name) of every reference the platform will expand, in document order."""
    from crossaudit.kernel.dsl import EvaluatorType

    out: list[tuple[Path, str]] = []
    for i, ev in enumerate(policy.evaluators):
        if ev is None or not isinstance(ev.config, Mapping):
            continue
        base: Path = ("evaluators", i, "config")
        kind = ev.kind
        if kind is EvaluatorType.CUSTOM:
            for key, value in ev.config.items():
                if key not in CUSTOM_CONFIG_FIELDS:
                    out.extend(_walk(value, (*base, key)))
        elif kind is EvaluatorType.LLM:
            for key in LLM_EXPANDED_FIELDS:
                out.extend(_walk(ev.config.get(key), (*base, key)))
        else:
            out.extend(_walk(ev.config, base))
    for i, rule in enumerate(policy.rules):
        if rule is None or not isinstance(rule.action_config, Mapping):
            continue
        out.extend(_walk(rule.action_config.get("headers"), ("rules", i, "action_config", "headers")))
    return out


def expand(
    value: Any,
    source: SecretSource | Mapping[str, str] | None,
    use: SecretUse | None = None,
    *,
    where: str = "",
) -> Any:
    """Replace ``${NAME}`` recursively with the source's current values, recording each in ``use``.

    A name that is not granted, unset or empty raises ConfigurationError naming it (``where``
    says which field), never its value.
    """
    src = as_secret_source(source)
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            granted = src.granted(name) or not src.strict
            found = src.get(name) if granted else None
            if not found:
                if not src.strict:
                    state = "is not set"
                elif not granted:
                    state = "is not granted to this tenant"
                else:
                    state = "is unavailable (see the server log)"
                prefix = f"{where}: " if where else ""
                raise ConfigurationError(f"{prefix}{src.kind} {name} {state}")
            if use is not None:
                use.add(found)
            return found

        return ENV_RE.sub(sub, value)
    if isinstance(value, Mapping):
        return {k: expand(v, src, use, where=where) for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v, src, use, where=where) for v in value]
    return value
