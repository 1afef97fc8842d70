"""An API-keys file with roles, and a policy that sends content to a content moderator's review
(shared by tests/security/test_roles.py and tests/e2e/test_review_console.py)."""

from __future__ import annotations

KEYS = {
    "admin": "acme-admin-key-0123456789abcdef",
    "service": "acme-service-key-0123456789abcdef",
    "moderator": "acme-alice-key-0123456789abcdef",  # reviewer alice: content_moderator
    "reviewer": "acme-bob-key-0123456789abcdef",  # reviewer bob: no reviewer role
    "globex_reviewer": "globex-carol-key-0123456789abcdef",  # another tenant's content_moderator
    "globex_admin": "globex-admin-key-0123456789abcdef",
}

KEYS_FILE = f"""
tenants:
  acme:
    keys:
      - {KEYS["admin"]}
      - {{key: {KEYS["service"]}, role: service, name: checkout}}
      - {{key: {KEYS["moderator"]}, role: reviewer, name: alice, reviewer_roles: [content_moderator]}}
      - {{key: {KEYS["reviewer"]}, role: reviewer, name: bob}}
  globex:
    keys:
      - {KEYS["globex_admin"]}
      - {{key: {KEYS["globex_reviewer"]}, role: reviewer, name: carol, reviewer_roles: [content_moderator]}}
"""

# 'unsafe' in the response fails the rule: the item waits for a content moderator.
MODERATED = """
name: moderated
description: sends unsafe answers to a content moderator
version: "1.0"
evaluators:
  - name: unsafe_words
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            hit = "unsafe" in response
            return {"score": 0.1 if hit else 1.0, "violations": ["unsafe"] if hit else []}
  - name: rude_words
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {"score": 0.2 if "rude" in response else 1.0}
rules:
  - name: needs_moderation
    evaluator: unsafe_words
    threshold: 0.5
    action: require_review
    action_config:
      reviewer_role: content_moderator
      max_review_time: 2h
  - name: rude_flag
    evaluator: rude_words
    threshold: 0.5
    action: flag
    action_config:
      severity: high
"""
