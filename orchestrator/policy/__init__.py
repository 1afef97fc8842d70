"""The policy layer: DSL models, safe loading, validation, JSON Schema. Imports no runners.

Imports are lazy so that ``orchestrator.policy.models`` (pure pydantic) can be used alone,
e.g. by the model-server images, without the validator's dependencies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.policy.models import Policy
    from orchestrator.policy.validate import load_policy, load_policy_file

__all__ = ["Policy", "load_policy", "load_policy_file"]


def __getattr__(name: str) -> Any:
    if name == "Policy":
        from orchestrator.policy.models import Policy

        return Policy
    if name in ("load_policy", "load_policy_file"):
        from orchestrator.policy import validate

        return getattr(validate, name)
    raise AttributeError(name)
