"""Policies the tests that run a real server deploy (e2e, security, integration and bench), with
custom evaluators only: they run offline. Fixed texts for policies one suite reads closely, and
small builders (``custom_policy`` and the kinds made with it) where tests differ only in names,
scores, actions or destinations."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Sequence
from typing import Any


def returns(expr: str) -> str:
    """The code of an ``evaluate`` that returns the Python expression ``expr``."""
    return f"def evaluate(prompt, response, context):\n    return {expr}\n"


def flags_word(word: str) -> str:
    """The code of an ``evaluate`` that scores 0.0 when ``word`` is in the response, else 1.0."""
    return returns(f'{{"score": 0.0 if "{word}" in response else 1.0}}')


_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "y", "n", "null"}  # not strings to YAML


def _yaml(value: Any) -> str:
    """``value`` as YAML: a plain word as it is, anything else in JSON's (flow) syntax."""
    plain = isinstance(value, str) and re.fullmatch(r"[A-Za-z_][\w-]*", value) and value.lower() not in _YAML_WORDS
    return value if plain else json.dumps(value)


def custom_policy(
    name: str,
    code: str,
    *,
    evaluator: str,
    rules: Sequence[str],
    threshold: float | None = 0.5,
    action: str | None = "block",
    settings: dict[str, Any] | None = None,
    description: str = "one custom evaluator",
    version: str = "1.0",
    **rule_keys: Any,
) -> str:
    """One custom evaluator named ``evaluator`` running ``code``, and one rule over it per name in
    ``rules``, each with ``threshold``, ``action`` and ``rule_keys`` (e.g. ``action_config``);
    a ``None`` threshold or action is left out (the loader's default)."""
    lines = [f"name: {name}", f"description: {description}", f'version: "{version}"']
    if settings:
        lines.append(f"settings: {_yaml(settings)}")
    lines += ["evaluators:", f"  - name: {evaluator}", "    type: custom", "    config:", "      code: |"]
    lines.append(textwrap.indent(textwrap.dedent(code).strip("\n"), " " * 8))
    lines.append("rules:")
    fields = {"threshold": threshold, "action": action, **rule_keys}
    for rule in rules:
        lines += [f"  - name: {rule}", f"    evaluator: {evaluator}"]
        lines += [f"    {k}: {_yaml(v)}" for k, v in fields.items() if v is not None]
    return "\n".join(lines) + "\n"


def trivial(name: str, *, rule: str = "fine", **kw: Any) -> str:
    """One blocking rule over an evaluator that always scores 1.0: the cheapest real decision."""
    return custom_policy(name, returns('{"score": 1.0}'), evaluator="ok", rules=[rule], **kw)


def word_policy(name: str, word: str = "bad", *, evaluator: str = "has_bad", rule: str = "no_bad", **kw: Any) -> str:
    """One rule (``block`` unless ``action``) failing when ``word`` is in the response."""
    return custom_policy(name, flags_word(word), evaluator=evaluator, rules=[rule], **kw)


def webhook_policy(
    name: str,
    url: str,
    *,
    code: str = flags_word("bad"),
    evaluator: str = "has_bad",
    rules: Sequence[str] = ("notify",),
    payload: dict[str, str] | None = None,
    **action_config: Any,
) -> str:
    """Rules whose failure sends a webhook to ``url`` (by default when 'bad' is in the response);
    ``payload`` defaults to the rule's name, ``action_config`` adds e.g. ``method`` or ``headers``."""
    config = {"webhook_url": url, **action_config, "payload": payload or {"rule": "{{rule.name}}"}}
    return custom_policy(
        name, code, evaluator=evaluator, rules=rules, action="custom", action_config=config,
        description="failed rules send webhooks",
    )  # fmt: skip


def burner(name: str, seconds: float, *, evaluator: str, rule: str, action: str | None = "block", **kw: Any) -> str:
    """An evaluator that burns CPU for ``seconds`` (the process sandbox forbids ``import time``),
    then passes, its start and end times (timestamps) in ``details["start"]`` and ``details["end"]``."""
    code = f"""
        import datetime

        def evaluate(prompt, response, context):
            start = datetime.datetime.now().timestamp()
            while datetime.datetime.now().timestamp() < start + {seconds}:  # burns, bounded by time
                pass
            return {{"score": 1.0, "details": {{"start": start, "end": datetime.datetime.now().timestamp()}}}}
    """
    return custom_policy(
        name, code, evaluator=evaluator, rules=[rule], action=action, description=f"computes for {seconds} s", **kw
    )


BULKY_VIOLATIONS = 900  # of 1,000 characters each: ~0.9 MB of result, within the sandbox's 1 MiB


def bulky(name: str = "bulky", rules: int = 6) -> str:
    """``rules`` flag rules over one evaluator that returns ~0.9 MB of violations, raw audit on."""
    return custom_policy(
        name,
        returns(f'{{"score": 0.0, "violations": ["v" * 1000] * {BULKY_VIOLATIONS}}}'),
        evaluator="noisy",
        rules=[f"r{i}" for i in range(rules)],
        action="flag",
        settings={"audit_all_evaluations": True},
        description="an evaluator with a very large result",
    )


KEYWORDS = """
name: keywords
description: flags 'bad', sends 'worse' to review
version: "1.0"
evaluators:
  - name: has_bad
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            hit = "bad" in response
            return {"score": 0.0 if hit else 1.0, "violations": ["bad"] if hit else []}
  - name: has_worse
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {"score": 0.0 if "worse" in response else 1.0, "details": {"length": len(response)}}
rules:
  - name: no_bad
    evaluator: has_bad
    threshold: 0.5
    action: flag
    action_config:
      severity: high
  - name: no_worse
    evaluator: has_worse
    threshold: 0.5
    action: require_review
    action_config:
      reviewer_role: moderator
"""

KEYWORDS_V2 = KEYWORDS.replace('version: "1.0"', 'version: "2.0"').replace('"bad" in response', '"nasty" in response')


def sleeper(*, fallback: bool) -> str:
    """A blocking rule whose evaluator computes for 10 s; ``fallback``: it warns on error instead."""
    return burner(
        "sleeper-fallback" if fallback else "sleeper", 10, evaluator="slow", rule="slow_rule",
        fallback={"on_error": "warn"} if fallback else None,
    )  # fmt: skip


def uses_upload(evaluator_id: str, name: str = "uploaded") -> str:
    return f"""
name: uses-upload
description: references an uploaded evaluator by id
version: "1.0"
evaluators:
  - id: "{evaluator_id}"
    name: {name}
    type: custom
rules:
  - name: uploaded_rule
    evaluator: {name}
    threshold: 0.5
    action: block
"""


UPLOAD_CODE = """
def evaluate(prompt, response, context):
    return {"score": 0.25 if "block me" in response else 0.75, "details": {"source": "upload"}}
"""


def ten_rules(*, cached: bool = False) -> str:
    """A 10-rule policy over two fast custom evaluators (for the benchmark). ``cached``: the
    engine caches evaluator results, so repeated inputs measure everything but the sandbox."""
    rules = "\n".join(
        f"""  - name: rule_{i}
    evaluator: {"kw" if i % 2 else "len"}
    threshold: 0.5
    action: {"flag" if i % 3 else "warn"}
    priority: {100 - i}"""
        for i in range(10)
    )
    name = "ten-rules-cached" if cached else "ten-rules"
    settings = "settings:\n  cache_results: true\n  cache_duration: 3600\n" if cached else ""
    return f"""
name: {name}
description: ten rules over two custom evaluators
version: "1.0"
evaluators:
  - name: kw
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {{"score": 0.0 if "forbidden" in response else 1.0}}
  - name: len
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {{"score": 1.0 if len(response) < 10000 else 0.0, "details": {{"n": len(response)}}}}
{settings}rules:
{rules}
"""


LEARNING = """
name: learning
description: a rule whose threshold follows reviewers' feedback
version: "1.0"
evaluators:
  - name: three_quarters
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {"score": 0.75}
rules:
  - name: strict
    evaluator: three_quarters
    threshold: 0.8
    action: flag
    feedback_config:
      collect_user_feedback: true
      update_model: true
      feedback_weight: 0.2
      min_feedback_count: 2
"""


def busy(seconds: float) -> str:
    """A policy whose evaluator computes for ``seconds`` (graceful shutdown tests)."""
    return burner("busy", seconds, evaluator="slowish", rule="r", action=None)


MULTI_LANGUAGE = """
name: multi-language
description: the guide's rule chaining on a builtin language detector
version: "1.0"
evaluators:
  - name: language_detector
    type: builtin
    config:
      model: langdetect
  - name: en_safety
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {"score": 0.0 if "harm" in response else 1.0}
rules:
  - name: detect_language
    evaluator: language_detector
    threshold: 0.5
    action: continue
    priority: 100
  - name: english_safety
    evaluator: en_safety
    threshold: 0.8
    action: block
    priority: 90
    conditions:
      - field: previous_rule.detect_language.detected_language
        operator: equals
        value: en
"""


# A dynamic threshold with a time-of-day modifier: the engine reads the context's time.hour/minute.
TIME_OF_DAY = """
name: dyn
description: d
version: "1.0"
evaluators:
  - name: ok
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {"score": 1.0}
rules:
  - name: r
    evaluator: ok
    threshold: dynamic
    threshold_config:
      base_threshold: 0.5
      time_of_day_modifier: {"09:00-17:00": 0.1}
    action: block
"""
