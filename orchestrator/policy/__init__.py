"""Policy loading: bounded YAML, validation, ``${VAR}`` expansion, inlining, JSON Schema.

The DSL models themselves are kernel types (:mod:`crossaudit.kernel.dsl`); ``Policy`` is
re-exported here because loading is how callers get one.
"""

from crossaudit.kernel.dsl import Policy
from orchestrator.policy.validate import load_policy, load_policy_file

__all__ = ["Policy", "load_policy", "load_policy_file"]
