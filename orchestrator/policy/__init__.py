"""The policy layer: DSL models, safe loading, validation, JSON Schema. Imports no runners."""

from orchestrator.policy.models import Policy
from orchestrator.policy.validate import load_policy, load_policy_file

__all__ = ["Policy", "load_policy", "load_policy_file"]
