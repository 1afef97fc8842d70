"""What every builtin's config shares: which text is analysed, and the list-length bound."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field

from crossaudit.kernel.dslbase import CommonEvaluatorConfig

MAX_LISTED = 64  # categories / entities / languages in one builtin config


class BuiltinConfigBase(CommonEvaluatorConfig):
    """Shared by the builtins. Also the model server's wire validation (one definition)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model_kind: ClassVar[str]  # the builtin's name in the registry, equal to its ``model`` literal

    text: Literal["response", "prompt"] = Field(
        default="response", description="Which text is analysed (spans and redaction apply to the response)"
    )
