"""The Detoxify builtin's config (toxicity classifier); its runtime is ``crossaudit.modelserver.builtins.detoxify``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from crossaudit.kernel.builtins.base import MAX_LISTED, BuiltinConfigBase

DETOXIFY_CATEGORIES = (
    "toxicity",
    "severe_toxicity",
    "obscene",
    "threat",
    "insult",
    "identity_attack",
    "sexual_explicit",
)


class DetoxifyConfig(BuiltinConfigBase):
    model_kind: ClassVar[str] = "detoxify"

    model: Literal["detoxify"] = Field(description="Detoxify toxicity classifier")
    variant: Literal["original", "unbiased", "multilingual"] = Field(default="original", description="Model variant")
    threshold: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Category probability at or above which the text is toxic"
    )
    categories: tuple[str, ...] = Field(
        default=("toxicity",),
        description=f"Categories considered, e.g. {', '.join(DETOXIFY_CATEGORIES)}; [] = all the model predicts",
    )
    checkpoint: str | None = Field(default=None, description="Local checkpoint file (no hub downloads)")
    huggingface_config_path: str | None = Field(default=None, description="Local tokenizer/config directory")
    precision: Literal["auto", "fp32", "int8"] = Field(
        default="auto",
        description="Which copy of an ONNX export (`crossaudit models export`) to serve: auto (int8 when the export "
        "has it, else fp32), fp32, or the dynamically quantized int8 one (about 3x faster on CPU, probabilities "
        "within about 0.005 of fp32); a torch checkpoint is fp32 only",
    )

    @field_validator("categories")
    @classmethod
    def _categories(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        out = tuple(dict.fromkeys(c.strip().lower() for c in v if c.strip()))
        if len(out) > MAX_LISTED:
            raise ValueError(f"at most {MAX_LISTED} categories")
        return out
