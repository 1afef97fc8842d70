"""The Presidio builtin's config (PII analyzer); its runtime is ``crossaudit.modelserver.builtins.presidio``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from crossaudit.kernel.builtins.base import MAX_LISTED, BuiltinConfigBase

# The guide writes short entity names; Presidio's recognizers use these.
PRESIDIO_ENTITY_ALIASES: dict[str, str] = {
    "EMAIL": "EMAIL_ADDRESS",
    "SSN": "US_SSN",
    "PHONE": "PHONE_NUMBER",
    "CREDIT_CARD_NUMBER": "CREDIT_CARD",
    "IP": "IP_ADDRESS",
}
DEFAULT_PRESIDIO_ENTITIES = ("PERSON", "EMAIL_ADDRESS", "PHONE_NUMBER", "US_SSN", "CREDIT_CARD")


class PresidioConfig(BuiltinConfigBase):
    model_kind: ClassVar[str] = "presidio"

    model: Literal["presidio"] = Field(description="Presidio PII analyzer")
    entities: tuple[str, ...] = Field(
        default=DEFAULT_PRESIDIO_ENTITIES, description="Entity types (EMAIL, SSN and PHONE are accepted aliases)"
    )
    confidence_threshold: float = Field(default=0.5, ge=0.0, le=1.0, description="Ignore findings below this")
    language: str = Field(default="en", min_length=2, max_length=12, description="Text language")
    spacy_model_path: str | None = Field(default=None, description="Local spaCy pipeline directory")

    @field_validator("entities")
    @classmethod
    def _entities(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        names = [e.strip().upper() for e in v if e.strip()]
        out = tuple(dict.fromkeys(PRESIDIO_ENTITY_ALIASES.get(n, n) for n in names))
        if not out:
            raise ValueError("entities must name at least one entity type")
        if len(out) > MAX_LISTED:
            raise ValueError(f"at most {MAX_LISTED} entities")
        return out
