"""JSON Schema for policy files (editors validate and complete policies with it)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter

from crossaudit.kernel.dsl import ACTION_CONFIGS, BUILTIN_MODELS, CustomConfig, LLMConfig, Policy

SCHEMA_ID = "https://crossaudit.dev/schemas/policy.schema.json"


def policy_json_schema() -> dict[str, Any]:
    """The document schema with the per-type ``config`` and per-action ``action_config`` shapes."""
    schema = Policy.model_json_schema(mode="validation")
    defs = schema.setdefault("$defs", {})

    def ref(model: Any) -> dict[str, str]:
        sub = TypeAdapter(model).json_schema(ref_template="#/$defs/{model}")
        for name, d in sub.pop("$defs", {}).items():
            defs.setdefault(name, d)
        defs.setdefault(model.__name__, sub)
        return {"$ref": f"#/$defs/{model.__name__}"}

    config_refs = [ref(m) for m in (LLMConfig, CustomConfig, *BUILTIN_MODELS.values())]
    defs["EvaluatorSpec"]["properties"]["config"] = {
        "description": defs["EvaluatorSpec"]["properties"]["config"].get("description", ""),
        "anyOf": config_refs,
    }
    seen: list[str] = []
    action_refs = []
    for model in ACTION_CONFIGS.values():
        if model.__name__ not in seen:
            seen.append(model.__name__)
            action_refs.append(ref(model))
    defs["Rule"]["properties"]["action_config"] = {
        "description": defs["Rule"]["properties"]["action_config"].get("description", ""),
        "anyOf": action_refs,
    }
    thr = defs["Rule"]["properties"]["threshold"]
    thr.pop("type", None)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
    return schema


def policy_json_schema_text() -> str:
    return json.dumps(policy_json_schema(), indent=2, sort_keys=True) + "\n"
