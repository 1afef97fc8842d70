"""Policies the end-to-end tests deploy (custom evaluators only: they run offline)."""

from __future__ import annotations

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
    """A custom evaluator that computes for 10 s (the process sandbox forbids ``import time``)."""
    fb = "\n    fallback:\n      on_error: warn" if fallback else ""
    name = "sleeper-fallback" if fallback else "sleeper"
    return f"""
name: {name}
description: an evaluator that takes 10 s
version: "1.0"
evaluators:
  - name: slow
    type: custom
    config:
      code: |
        import datetime

        def evaluate(prompt, response, context):
            end = datetime.datetime.now() + datetime.timedelta(seconds=10)
            n = 0
            while datetime.datetime.now() < end:
                n += 1
            return {{"score": 1.0}}
rules:
  - name: slow_rule
    evaluator: slow
    threshold: 0.5
    action: block{fb}
"""


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
    return f"""
name: busy
description: takes a while
version: "1.0"
evaluators:
  - name: slowish
    type: custom
    config:
      code: |
        import datetime

        def evaluate(prompt, response, context):
            end = datetime.datetime.now() + datetime.timedelta(seconds={seconds})
            while datetime.datetime.now() < end:
                pass
            return {{"score": 1.0}}
rules:
  - name: r
    evaluator: slowish
    threshold: 0.5
"""


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
