"""A split vote becomes a review item, through a real server: `on_disagreement: require_review`."""

from __future__ import annotations

import pytest

from crossaudit import Client
from crossaudit.kernel.errors import PolicyValidationError
from tests.e2e.conftest import ServerProcess, key

pytestmark = pytest.mark.e2e

SPLIT = """
name: split
description: three judges; a split vote goes to a person
version: "1.0"
evaluators:
  - name: strict
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {"score": 0.1 if "maybe" in response else 0.9}
  - name: lenient
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {"score": 0.9}
  - name: middle
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {"score": 0.8}
rules:
  - name: judges
    evaluators: [{name: strict}, {name: lenient}, {name: middle}]
    consensus_strategy: majority
    threshold: 0.5
    action: block
    on_disagreement:
      min_spread: 0.3
      reviewer_role: safety_panel
      max_review_time: 2h
"""


def test_a_split_vote_becomes_a_review_item(server: ServerProcess) -> None:
    with Client(server.address, api_key=key("acme")) as c:
        c.deploy_policy(SPLIT)
        agreed = c.evaluate("split", "p", "a clear answer", timeout=20)
        split = c.evaluate("split", "p", "maybe, maybe not", timeout=20)
        items = [r for r in c.list_reviews(state="open", policy="split")]
        audit = c.get_decision(split.decision_id)
    assert agreed.passed and agreed.action.value == "allow"
    assert not split.passed and split.action.value == "require_review"  # not the rule's block
    assert "evaluators disagree: 2 pass / 1 fail" in split.rules[0].reason
    [item] = items
    assert item.decision_id == split.decision_id and item.kind.value == "require_review"
    assert item.params["reviewer_role"] == "safety_panel" and item.params["review_due_at"]
    assert "evaluators disagree" in item.params["disagreement"]
    assert audit.action == "require_review"


def test_on_disagreement_needs_several_evaluators(server: ServerProcess) -> None:
    one = SPLIT.replace("evaluators: [{name: strict}, {name: lenient}, {name: middle}]", "evaluator: strict")
    one = one.replace("    consensus_strategy: majority\n", "")
    with Client(server.address, api_key=key("acme")) as c, pytest.raises(PolicyValidationError) as info:
        c.deploy_policy(one)
    assert "on_disagreement needs 'evaluators'" in str(info.value)
    assert "rules[0].on_disagreement" in str(info.value)
