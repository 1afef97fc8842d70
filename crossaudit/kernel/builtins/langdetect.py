"""The langdetect builtin's config (language identification); its runtime is
``crossaudit.modelserver.builtins.langdetect``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from crossaudit.kernel.builtins.base import BuiltinConfigBase


class LangdetectConfig(BuiltinConfigBase):
    model_kind: ClassVar[str] = "langdetect"

    model: Literal["langdetect"] = Field(description="Language identification")
    expected_languages: tuple[str, ...] = Field(
        default=(), description="If set, the score is the probability of the best expected language"
    )
    max_candidates: int = Field(default=5, ge=1, le=20, description="Candidate languages listed in details")

    @field_validator("expected_languages")
    @classmethod
    def _languages(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(x.strip().lower() for x in v if x.strip()))
