"""Pydantic models for every construct of the policy DSL guide.

Two layers: the *document* models below mirror the YAML exactly (``extra="forbid"``, a
description on every field). Evaluator ``config`` and rule ``action_config`` are kept as
mappings on the document and validated per type/action by ``orchestrator.policy.validate``
(so errors carry the right field path and every error of a file is reported at once);
the typed results are attached as ``EvaluatorSpec.typed_config`` and
``Rule.typed_action_config``.

This module imports no Docker, gRPC or model code: loading a policy touches nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, PrivateAttr, field_validator, model_validator

# The builtins' configs live one module per builtin (see crossaudit.kernel.builtins); re-exported as DSL types.
from crossaudit.kernel.builtins import BUILTIN_MODELS as BUILTIN_MODELS
from crossaudit.kernel.builtins import BuiltinConfig as BuiltinConfig
from crossaudit.kernel.builtins import BuiltinConfigBase as BuiltinConfigBase
from crossaudit.kernel.builtins import DetoxifyConfig as DetoxifyConfig
from crossaudit.kernel.builtins import LangdetectConfig as LangdetectConfig
from crossaudit.kernel.builtins import PresidioConfig as PresidioConfig
from crossaudit.kernel.dslbase import CommonEvaluatorConfig as CommonEvaluatorConfig
from crossaudit.kernel.dslbase import Strict as Strict
from crossaudit.kernel.durations import DURATION_PATTERN, duration_seconds
from crossaudit.kernel.names import canonical_name
from crossaudit.kernel.results import Action

NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_\-]{0,127}$"
SEMVER_PATTERN = r"^\d+(\.\d+){0,2}([-+][0-9A-Za-z.\-+]+)?$"
TIME_RANGE_PATTERN = r"^([01]\d|2[0-3]):[0-5]\d-([01]\d|2[0-3]):[0-5]\d$"

DEFAULT_LLM_MODEL = "gpt-4o-mini"  # used (with a validation warning) when an llm evaluator names no model
Name = Annotated[str, Field(pattern=NAME_PATTERN, description="identifier: letters, digits, _ and -")]
Unit = Annotated[float, Field(ge=0.0, le=1.0)]


# --- metadata ---------------------------------------------------------------------------


class Priority(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


def _date_to_str(v: Any) -> Any:
    # YAML turns unquoted dates into date objects; policies keep them as ISO strings.
    if isinstance(v, _dt.datetime | _dt.date):
        return v.isoformat()
    return v


class Metadata(Strict):
    author: str | None = Field(default=None, description="Policy author, e.g. 'Jane Doe <jane@corp.com>'")
    created: str | None = Field(default=None, description="Creation date/time (ISO 8601)")
    updated: str | None = Field(default=None, description="Last update date/time (ISO 8601)")
    tags: list[str] = Field(default_factory=list, description="Free-form tags")
    category: str | None = Field(default=None, description="Policy category, e.g. 'content-safety'")
    priority: Priority | None = Field(default=None, description="Business priority: low, medium, high, critical")
    compliance_frameworks: list[str] = Field(default_factory=list, description="Frameworks, e.g. gdpr, hipaa")
    documentation_url: str | None = Field(default=None, description="Link to human documentation")

    @field_validator("created", "updated", mode="before")
    @classmethod
    def _dates_to_str(cls, v: Any) -> Any:
        return _date_to_str(v)

    @field_validator("created", "updated")
    @classmethod
    def _iso(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError as e:
            raise ValueError(f"not an ISO 8601 date/time: {v!r}") from e
        return v


# --- evaluators -------------------------------------------------------------------------


class EvaluatorType(StrEnum):
    LLM = "llm"
    CUSTOM = "custom"
    BUILTIN = "builtin"


class LLMProvider(StrEnum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    GOOGLE = "google"
    AZURE = "azure"
    OPENAI_COMPATIBLE = "openai_compatible"


class LLMConfig(CommonEvaluatorConfig):
    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: LLMProvider = Field(
        default=LLMProvider.OPENAI, description="openai, anthropic, google, azure or openai_compatible"
    )
    model: str = Field(default=DEFAULT_LLM_MODEL, min_length=1, description="Model (or Azure deployment) name")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="Sampling temperature")
    max_tokens: int = Field(default=500, gt=0, le=100_000, description="Completion token cap")
    system_prompt: str | None = Field(default=None, description="Instructions; should ask for a JSON score")
    response_format: Literal["json", "text"] = Field(default="json", description="Ask the model for JSON")
    api_key: str | None = Field(default=None, description="Key or '${ENV_VAR}'; default: provider's env var")
    base_url: str | None = Field(default=None, description="Endpoint override (vLLM, Ollama, proxies)")
    api_version: str | None = Field(default=None, description="Azure OpenAI API version")
    organization: str | None = Field(default=None, description="OpenAI organization id")
    rate_limit_burst: int | None = Field(default=None, gt=0, description="Burst size of rate_limit (default rpm/10)")

    @field_validator("provider", mode="before")
    @classmethod
    def _provider(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v


class CustomConfig(CommonEvaluatorConfig):
    """Custom Python code. Keys not listed here are *parameters* passed to the code.

    The code is taken from, in order: the evaluator's ``id`` (an uploaded evaluator),
    ``code``, ``code_file`` (relative to the policy file), ``evaluators/<name>.py`` next to
    the policy file, or an uploaded evaluator with the same name. Files are read where the
    author is: by PolicyTester, or inlined as ``code`` by ``crossaudit policy deploy``; the
    service never reads a file a policy names.
    """

    model_config = ConfigDict(extra="allow")

    language: Literal["python"] = Field(default="python", description="Only python is supported")
    dependencies: list[str] = Field(default_factory=list, description="pip requirements, e.g. 'textblob>=0.18'")
    code: str | None = Field(default=None, description="Inline source defining evaluate(prompt, response, context)")
    code_file: str | None = Field(
        default=None, description="Path to the source, relative to the policy file (inlined by deploy)"
    )

    @property
    def parameters(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


TypedEvaluatorConfig = LLMConfig | CustomConfig | BuiltinConfig


class EvaluatorSpec(Strict):
    id: str | None = Field(
        default=None,
        max_length=128,
        description="Id of an uploaded evaluator (UUID); its code runs as this evaluator",
    )
    name: Name = Field(description="Name rules use to reference this evaluator")
    type: EvaluatorType | None = Field(
        default=None, description="llm, custom or builtin (inferred as custom when only an id is given)"
    )
    description: str | None = Field(default=None, description="What the evaluator checks")
    config: dict[str, Any] = Field(default_factory=dict, description="Type-specific configuration")

    _typed: TypedEvaluatorConfig | None = PrivateAttr(default=None)

    @property
    def typed_config(self) -> TypedEvaluatorConfig:
        # Read on every evaluator call: pydantic's private-attribute __getattr__ is slow, the
        # private dict is not.
        typed = self.__pydantic_private__["_typed"]
        if typed is None:
            raise RuntimeError(f"evaluator {self.name!r} was not validated")
        return typed

    @property
    def kind(self) -> EvaluatorType:
        return self.type or EvaluatorType.CUSTOM


# --- rules ------------------------------------------------------------------------------


class Operator(StrEnum):
    EQUALS = "equals"
    NOT_EQUALS = "not_equals"
    CONTAINS = "contains"
    NOT_CONTAINS = "not_contains"
    STARTS_WITH = "starts_with"
    ENDS_WITH = "ends_with"
    IN = "in"
    NOT_IN = "not_in"
    GREATER_THAN = "greater_than"
    LESS_THAN = "less_than"
    REGEX_MATCH = "regex_match"


class Condition(Strict):
    field: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+)*$",
        description="Dotted path into the request context, or previous_rule.<rule>.<field>",
    )
    operator: Operator = Field(description="One of the 11 condition operators")
    value: Any = Field(description="Comparison value (a list for in/not_in; CIDR ranges allowed for IPs)")

    @property
    def previous_rule(self) -> str | None:
        parts = self.field.split(".")
        return parts[1] if parts[0] == "previous_rule" and len(parts) >= 3 else None


class RuleSettings(Strict):
    timeout: float | None = Field(default=None, gt=0, description="Seconds this rule's evaluator may take")
    cache_duration: float | None = Field(default=None, ge=0, description="Seconds a cached result stays valid")
    retry_on_failure: bool | None = Field(default=None, description="Retry retryable evaluator errors")
    retries: int | None = Field(default=None, ge=0, le=10, description="Retries for this rule (default: policy)")


class FallbackOnError(StrEnum):
    WARN = "warn"
    BLOCK = "block"
    ALLOW = "allow"
    FLAG = "flag"
    REQUIRE_REVIEW = "require_review"


class Fallback(Strict):
    evaluator: str | None = Field(default=None, description="Evaluator to use when the primary one errors")
    on_error: FallbackOnError | None = Field(
        default=None, description="Outcome when no evaluator could answer: warn, block or allow (fail-open)"
    )


class FeedbackConfig(Strict):
    collect_user_feedback: bool = Field(default=False, description="Accept feedback on this rule's decisions")
    update_model: bool = Field(default=False, description="Adjust the threshold from collected feedback")
    feedback_weight: float = Field(default=0.1, ge=0.0, le=1.0, description="How far feedback moves the threshold")
    min_feedback_count: int = Field(default=10, ge=1, description="Feedback needed before any adjustment")


class DynamicThresholdConfig(Strict):
    base_threshold: Unit = Field(description="Starting threshold")
    user_trust_modifier: float = Field(
        default=0.0, ge=-1.0, le=1.0, description="Added × user trust (context user.trust_score, or user.trusted)"
    )
    content_sensitivity_modifier: float = Field(
        default=0.0,
        ge=-1.0,
        le=1.0,
        description="Added × content sensitivity (context content.sensitivity, or content.sensitive)",
    )
    time_of_day_modifier: dict[str, float] = Field(
        default_factory=dict, description="'HH:MM-HH:MM' (may wrap midnight) → modifier; first match applies"
    )

    @field_validator("time_of_day_modifier")
    @classmethod
    def _ranges(cls, v: dict[str, float]) -> dict[str, float]:
        for key, mod in v.items():
            if not re.match(TIME_RANGE_PATTERN, str(key)):
                raise ValueError(f"time range {key!r} must look like '09:00-17:00'")
            if not -1.0 <= float(mod) <= 1.0:
                raise ValueError(f"modifier for {key!r} must be within [-1, 1]")
        return v


class ConsensusStrategy(StrEnum):
    MAJORITY = "majority"
    UNANIMOUS = "unanimous"
    WEIGHTED_AVERAGE = "weighted_average"


class WeightedEvaluator(Strict):
    name: str = Field(description="Evaluator name")
    weight: float = Field(default=1.0, gt=0.0, description="Relative weight in the consensus")


def _disagreement_short_form_schema(schema: dict[str, Any]) -> None:
    """``on_disagreement``'s string form is normalised by DisagreementConfig's before-validator,
    which the generated schema cannot see: list it, so editors accept ``on_disagreement: decide``."""
    forms = schema.get("anyOf")
    if isinstance(forms, list):
        forms.insert(0, {"enum": ["require_review", "decide"], "type": "string"})


class Stage(StrEnum):
    """Where a rule applies when a gateway evaluates a model call in two steps (like OpenAI
    Guardrails' input and output checks): ``input`` checks the request before the model sees it,
    ``output`` the model's answer before the caller does, ``both`` (default) each of them.

    An agent's two channels are stages of their own (docs/agents.md): ``tool_call`` judges one
    tool call the model wants to make (the text is its arguments' JSON, the context ``tool.name``,
    ``tool.arguments``, ``tool.call_id``), ``tool_result`` a tool's output before the model reads
    it. ``both`` is input and output only: it never runs at a tool stage."""

    INPUT = "input"
    OUTPUT = "output"
    BOTH = "both"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"


# What an evaluation request may name as its stage; an empty stage runs every rule.
EVALUATION_STAGES = (Stage.INPUT.value, Stage.OUTPUT.value, Stage.TOOL_CALL.value, Stage.TOOL_RESULT.value)
# The stages a rule of each stage runs at (a request naming a stage).
RULE_STAGES: dict[Stage, frozenset[str]] = {
    Stage.INPUT: frozenset({"input"}),
    Stage.OUTPUT: frozenset({"output"}),
    Stage.BOTH: frozenset({"input", "output"}),
    Stage.TOOL_CALL: frozenset({"tool_call"}),
    Stage.TOOL_RESULT: frozenset({"tool_result"}),
}


class Rule(Strict):
    name: Name = Field(description="Unique rule identifier")
    description: str | None = Field(default=None, description="Human-readable description")
    evaluator: str | None = Field(default=None, description="Evaluator name (single-evaluator rule)")
    evaluators: list[WeightedEvaluator] | None = Field(
        default=None, min_length=1, description="Several evaluators combined by consensus_strategy"
    )
    consensus_strategy: ConsensusStrategy | None = Field(
        default=None, description="majority, unanimous or weighted_average (multi-evaluator rules)"
    )
    threshold: float | str = Field(
        default=0.5,
        description="Minimum score (0.0-1.0) to pass, or 'dynamic' with threshold_config",
        json_schema_extra={"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"const": "dynamic"}]},
    )
    threshold_config: DynamicThresholdConfig | None = Field(default=None, description="Dynamic threshold inputs")
    action: Action = Field(default=Action.BLOCK, description="Action when the rule fails (default: block)")
    action_config: dict[str, Any] = Field(default_factory=dict, description="Parameters of the action")
    enabled: bool = Field(default=True, description="Whether the rule is active")
    stage: Stage = Field(
        default=Stage.BOTH,
        description="Where the rule applies when a request names a stage (the guard proxy's steps): "
        "'input' (the prompt, before the model is called), 'output' (the model's answer), 'both' "
        "(default: input and output), 'tool_call' (one tool call the model wants to make: the text is "
        "its arguments' JSON, the context has tool.name, tool.arguments, tool.call_id) or 'tool_result' "
        "(a tool's output before the model reads it). A request naming another stage skips the rule "
        "(reported as skipped); a request naming no stage runs every rule",
    )
    priority: int = Field(default=0, description="Execution order: higher first")
    conditions: list[Condition] = Field(default_factory=list, description="All must hold for the rule to apply")
    settings: RuleSettings = Field(default_factory=RuleSettings, description="Rule-specific settings")
    fallback: Fallback | None = Field(default=None, description="Error handling")
    feedback_config: FeedbackConfig | None = Field(default=None, description="Feedback loop")
    on_disagreement: DisagreementConfig | None = Field(
        default=None,
        description="Multi-evaluator rules: 'require_review' sends a split vote (some evaluators pass, some "
        "fail, score spread >= min_spread) to a reviewer instead of deciding it; 'decide' (default) combines "
        "it by consensus_strategy. The object form sets min_spread and the review's reviewer_role and times",
        json_schema_extra=_disagreement_short_form_schema,
    )

    _typed_action: Any = PrivateAttr(default=None)

    @field_validator("threshold", mode="before")
    @classmethod
    def _threshold(cls, v: Any) -> Any:
        if v == "dynamic":
            return v
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"threshold must be a number between 0.0 and 1.0 or 'dynamic', got {v!r}")
        if not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"threshold must be between 0.0 and 1.0, got {v!r}")
        return float(v)

    @property
    def typed_action_config(self) -> ActionConfig:
        return self.__pydantic_private__["_typed_action"]  # hot path: see EvaluatorSpec.typed_config

    @property
    def evaluator_names(self) -> list[str]:
        if self.evaluators:
            return [e.name for e in self.evaluators]
        return [self.evaluator] if self.evaluator else []

    @property
    def depends_on(self) -> list[str]:
        seen: list[str] = []
        for c in self.conditions:
            ref = c.previous_rule
            if ref and ref not in seen:
                seen.append(ref)
        return seen


# --- action configs ---------------------------------------------------------------------


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


class ActionConfigBase(Strict):
    message: str | None = Field(default=None, description="Message for the caller / log")
    log_level: LogLevel | None = Field(default=None, description="Log level of the event")
    notify_admins: bool = Field(default=False, description="Notify administrators")
    redirect_url: str | None = Field(default=None, description="Where to send the user")


class BlockConfig(ActionConfigBase):
    error_code: str | None = Field(default=None, description="Machine-readable code, e.g. SAFETY_VIOLATION")
    http_status: int = Field(default=403, ge=100, le=599, description="HTTP status a gateway should answer")


class WarnConfig(ActionConfigBase):
    continue_processing: bool = Field(default=True, description="Keep evaluating lower-priority rules")


class Severity(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


MAX_DURATION_S = 3650 * 86400  # review/escalation times: ten years at most (larger ones overflow dates)


def _bounded_duration(text: str) -> str:
    if duration_seconds(text) > MAX_DURATION_S:
        raise ValueError(f"duration {text.strip()!r} is longer than the maximum of {MAX_DURATION_S // 86400}d")
    return text


Duration = Annotated[
    str, Field(pattern=DURATION_PATTERN, description="e.g. 30m, 2h, 24h, 7d"), AfterValidator(_bounded_duration)
]


RETENTION_OFF = ("off", "0")  # a retention duration that retains nothing


def retention_seconds(value: Any) -> float | None:
    """Seconds of a retention duration (``7d``, ``12h``; ``0`` or ``off``: 0); None when unset.
    ValueError naming the problem otherwise."""
    if value is None:
        return None
    if value is False:  # YAML 1.1 reads a bare ``off`` as false
        return 0.0
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError("expected a duration such as 7d or 12h, or 0/off")
    text = str(value).strip().lower()
    if text in RETENTION_OFF or (isinstance(value, int | float) and value == 0):
        return 0.0
    if not re.match(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration such as 7d or 12h, or 0/off")
    seconds = duration_seconds(text)
    if seconds > MAX_DURATION_S:
        raise ValueError(f"duration {text!r} is longer than the maximum of {MAX_DURATION_S // 86400}d")
    return seconds


class RetentionSettings(Strict):
    inputs: str | None = Field(
        default=None,
        description=(
            "Retain this policy's evaluation inputs (prompt, response, context, verdicts) for replay this long, "
            "e.g. 7d or 12h; 0 or off: never. Never longer than the tenant's retention in the API-keys file "
            "(nothing without one) or the server's retention.max_inputs_s (docs/retention.md)"
        ),
        examples=["7d", "12h", "off"],
    )

    @field_validator("inputs", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        if v is None:
            return None
        retention_seconds(v)  # ValueError: a located validation error
        return "off" if v is False else str(v).strip()

    def inputs_seconds(self) -> float | None:
        """Seconds asked for (0: off), None when the policy leaves it to the tenant's setting."""
        return retention_seconds(self.inputs)


class FlagConfig(ActionConfigBase):
    severity: Severity = Field(default=Severity.MEDIUM, description="low, medium, high, critical")
    assignee: str | None = Field(default=None, description="Team or person to review the flag")
    auto_escalate_after: Duration | None = Field(default=None, description="Escalate if untouched this long")


class ModifyStrategy(StrEnum):
    REDACT = "redact"
    REPLACE = "replace"
    SUMMARIZE = "summarize"


class ModifyConfig(ActionConfigBase):
    strategy: ModifyStrategy = Field(default=ModifyStrategy.REDACT, description="redact, replace or summarize")
    replacement_text: str = Field(default="[REDACTED]", description="Text put in place of what is removed")
    preserve_meaning: bool = Field(default=False, description="summarize: keep sentences without findings")


class RequireReviewConfig(ActionConfigBase):
    reviewer_role: str | None = Field(default=None, description="Role allowed to resolve the review")
    max_review_time: Duration | None = Field(default=None, description="Review deadline")
    auto_approve_after: Duration | None = Field(default=None, description="Approve automatically after this")


class DisagreementConfig(RequireReviewConfig):
    """``on_disagreement`` of a multi-evaluator rule (string form: the action alone)."""

    action: Literal["require_review", "decide"] = Field(
        default="require_review", description="require_review: send split votes to a reviewer; decide: do not"
    )
    min_spread: float = Field(
        default=0.3,
        ge=0.0,
        le=1.0,
        strict=True,  # a number: `min_spread: true` is a mistake, not 1.0
        description="Smallest spread (highest minus lowest evaluator score) that counts as a disagreement",
    )

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, v: Any) -> Any:
        if isinstance(v, str):
            return {"action": v}
        if not isinstance(v, dict | DisagreementConfig):
            raise ValueError(f"on_disagreement is 'require_review', 'decide' or a mapping, got {v!r}")
        return v

    @property
    def reviews(self) -> bool:
        return self.action == "require_review"


class CustomActionConfig(ActionConfigBase):
    webhook_url: str = Field(pattern=r"^https?://", description="Webhook endpoint (http/https)")
    method: Literal["POST", "PUT", "PATCH", "GET"] = Field(default="POST", description="HTTP method")
    headers: dict[str, str] = Field(default_factory=dict, description="Headers; '${ENV}' is expanded at send time")
    payload: dict[str, Any] = Field(default_factory=dict, description="Body; '{{rule.name}}'-style templates")


TEMPLATE_RE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")  # a ``{{field}}`` of a custom action's payload


@dataclass(frozen=True, slots=True)
class TemplateFields:
    """The values ``{{...}}`` in a custom action's payload may name, one attribute per field: the
    first ``_`` of an attribute's name is the dot (``rule_name`` is ``{{rule.name}}``). The
    validator accepts exactly :data:`TEMPLATE_FIELDS` and the engine renders :meth:`values`, so
    what a policy may write and what the engine fills in are one list."""

    rule_name: str
    rule_score: float | None
    rule_threshold: float | None
    rule_action: str
    rule_status: str
    policy_name: str
    policy_version: str
    content_hash: str
    content_length: int
    timestamp: str
    decision_id: str

    def values(self) -> dict[str, Any]:
        """``{"rule.name": ..., ...}``: what the templates are rendered from."""
        return {_template_name(f.name): getattr(self, f.name) for f in dataclasses.fields(self)}


def _template_name(attribute: str) -> str:
    return attribute.replace("_", ".", 1)


TEMPLATE_FIELDS = frozenset(_template_name(f.name) for f in dataclasses.fields(TemplateFields))


class ContinueConfig(ActionConfigBase):
    pass


ActionConfig = (
    BlockConfig | WarnConfig | FlagConfig | ModifyConfig | RequireReviewConfig | CustomActionConfig | ContinueConfig
)
ACTION_CONFIGS: dict[Action, type[ActionConfigBase]] = {
    Action.BLOCK: BlockConfig,
    Action.WARN: WarnConfig,
    Action.FLAG: FlagConfig,
    Action.MODIFY: ModifyConfig,
    Action.REQUIRE_REVIEW: RequireReviewConfig,
    Action.CUSTOM: CustomActionConfig,
    Action.CONTINUE: ContinueConfig,
    Action.ALLOW: ContinueConfig,
}


# --- policy -----------------------------------------------------------------------------


class PolicySettings(Strict):
    timeout: float | None = Field(default=None, gt=0, description="Seconds for the whole decision")
    retries: int | None = Field(default=None, ge=0, le=10, description="Retries of retryable evaluator errors")
    cache_results: bool = Field(default=False, description="Cache evaluator results")
    cache_duration: float | None = Field(default=None, ge=0, description="Seconds a cached result stays valid")
    audit_all_evaluations: bool = Field(default=False, description="Store raw prompt/response in the audit log")
    timezone: str = Field(default="UTC", description="IANA timezone for time.* condition fields")
    stop_on_block: bool = Field(
        default=True, description="A failed block rule skips lower-priority rules (one that got no verdict does not)"
    )
    retention: RetentionSettings | None = Field(
        default=None,
        description="Retained evaluation inputs for replay (a CrossAudit extension; docs/retention.md)",
    )


class TestInput(Strict):
    prompt: str = Field(default="", description="User prompt")
    response: str = Field(default="", description="AI response under evaluation")
    context: dict[str, Any] = Field(default_factory=dict, description="Request context")
    stage: Literal["input", "output", "tool_call", "tool_result"] | None = Field(
        default=None,
        description="The stage the request is evaluated at (only that stage's rules run; none: every rule). "
        "tool_call: response is the call's arguments (JSON) and context.tool.name names the tool",
    )


class TestCase(Strict):
    __test__ = False  # not a pytest class

    name: str = Field(description="Test case name")
    description: str | None = Field(default=None, description="What the case shows")
    input: TestInput = Field(description="The request")
    expected_result: Literal["pass", "fail", "error"] = Field(
        description=(
            "Expected decision: pass, fail, or error (a rule gets no verdict: an evaluator raised or "
            "timed out, or the request cannot be evaluated). A case expecting pass or fail that meets "
            "an error counts as an error, not as a pass"
        )
    )
    expected_action: Action | None = Field(
        default=None, description="Expected decision action (with error: the action the error led to)"
    )


class Policy(Strict):
    name: str = Field(min_length=1, max_length=200, description="Human-readable policy name")
    description: str = Field(min_length=1, description="Detailed policy description")
    version: str = Field(pattern=SEMVER_PATTERN, description="Semantic version, e.g. 1.0 or 2.1.3")
    metadata: Metadata = Field(default_factory=Metadata, description="Optional metadata")
    evaluators: list[EvaluatorSpec] = Field(default_factory=list, description="Evaluators used by rules")
    rules: list[Rule] = Field(default_factory=list, description="Governance rules")
    settings: PolicySettings = Field(default_factory=PolicySettings, description="Global settings")
    test_cases: list[TestCase] = Field(default_factory=list, description="Cases run by 'crossaudit policy test'")

    _source_path: str | None = PrivateAttr(default=None)
    _warnings: list[str] = PrivateAttr(default_factory=list)
    _digest: str = PrivateAttr(default="")

    @field_validator("version", mode="before")
    @classmethod
    def _version_str(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int | float) else v

    @field_validator("name")
    @classmethod
    def _canonical_name(cls, v: str) -> str:
        """NFC, nothing invisible: the name is stored and compared as written here, once
        (crossaudit.kernel.names), so two spellings of one name are one policy."""
        return canonical_name(v)

    @property
    def source_path(self) -> str | None:
        return self._source_path

    @property
    def warnings(self) -> list[str]:
        return self._warnings

    @property
    def digest(self) -> str:
        """sha256 of the source text: identifies a policy version's content."""
        return self.__pydantic_private__["_digest"]  # hot path: see EvaluatorSpec.typed_config

    def evaluator(self, name: str) -> EvaluatorSpec:
        for e in self.evaluators:
            if e.name == name:
                return e
        raise KeyError(name)

    def rule(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)


# Rule names DisagreementConfig, defined after it: resolve that reference now, so Rule's fields say
# their real types to every reader (the validator's did-you-mean hints walk them), not only after
# some validation happened to rebuild the model.
Rule.model_rebuild()
