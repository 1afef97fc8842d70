"""The two bases every evaluator config of the DSL shares.

They sit below :mod:`crossaudit.kernel.dsl` because the per-builtin config modules
(:mod:`crossaudit.kernel.builtins`) subclass them and ``dsl`` imports those modules' registry:
with the bases in ``dsl`` the two would import each other. ``dsl`` re-exports both.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """Base of every document model: unknown keys are errors (with did-you-mean)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, use_enum_values=False)


class CommonEvaluatorConfig(Strict):
    rate_limit: int | None = Field(default=None, gt=0, description="Requests per minute for this evaluator")
    timeout: float | None = Field(default=None, gt=0, description="Seconds one call may take")
