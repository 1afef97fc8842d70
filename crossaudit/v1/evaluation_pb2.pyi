from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTION_UNSPECIFIED: _ClassVar[Action]
    ACTION_CONTINUE: _ClassVar[Action]
    ACTION_ALLOW: _ClassVar[Action]
    ACTION_WARN: _ClassVar[Action]
    ACTION_FLAG: _ClassVar[Action]
    ACTION_MODIFY: _ClassVar[Action]
    ACTION_CUSTOM: _ClassVar[Action]
    ACTION_REQUIRE_REVIEW: _ClassVar[Action]
    ACTION_BLOCK: _ClassVar[Action]

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    STATUS_PASS: _ClassVar[Status]
    STATUS_FAIL: _ClassVar[Status]
    STATUS_ERROR: _ClassVar[Status]
    STATUS_TIMEOUT: _ClassVar[Status]
    STATUS_SKIPPED: _ClassVar[Status]
ACTION_UNSPECIFIED: Action
ACTION_CONTINUE: Action
ACTION_ALLOW: Action
ACTION_WARN: Action
ACTION_FLAG: Action
ACTION_MODIFY: Action
ACTION_CUSTOM: Action
ACTION_REQUIRE_REVIEW: Action
ACTION_BLOCK: Action
STATUS_UNSPECIFIED: Status
STATUS_PASS: Status
STATUS_FAIL: Status
STATUS_ERROR: Status
STATUS_TIMEOUT: Status
STATUS_SKIPPED: Status

class EvaluateRequest(_message.Message):
    __slots__ = ("policy", "environment", "prompt", "response", "context", "request_id", "stage", "provisional")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    PROVISIONAL_FIELD_NUMBER: _ClassVar[int]
    policy: str
    environment: str
    prompt: str
    response: str
    context: _struct_pb2.Struct
    request_id: str
    stage: str
    provisional: bool
    def __init__(self, policy: _Optional[str] = ..., environment: _Optional[str] = ..., prompt: _Optional[str] = ..., response: _Optional[str] = ..., context: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., request_id: _Optional[str] = ..., stage: _Optional[str] = ..., provisional: _Optional[bool] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("start", "end", "label", "score")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    label: str
    score: float
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ..., label: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class EvaluatorResult(_message.Message):
    __slots__ = ("evaluator", "kind", "status", "score", "passed", "violations", "details", "spans", "latency_ms", "attempts", "cached", "error", "error_type", "provenance")
    class ProvenanceEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    EVALUATOR_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    evaluator: str
    kind: str
    status: Status
    score: float
    passed: bool
    violations: _containers.RepeatedScalarFieldContainer[str]
    details: _struct_pb2.Struct
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    latency_ms: float
    attempts: int
    cached: bool
    error: str
    error_type: str
    provenance: _containers.ScalarMap[str, str]
    def __init__(self, evaluator: _Optional[str] = ..., kind: _Optional[str] = ..., status: _Optional[_Union[Status, str]] = ..., score: _Optional[float] = ..., passed: _Optional[bool] = ..., violations: _Optional[_Iterable[str]] = ..., details: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., latency_ms: _Optional[float] = ..., attempts: _Optional[int] = ..., cached: _Optional[bool] = ..., error: _Optional[str] = ..., error_type: _Optional[str] = ..., provenance: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ActionOutcome(_message.Message):
    __slots__ = ("rule", "action", "params")
    RULE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    rule: str
    action: Action
    params: _struct_pb2.Struct
    def __init__(self, rule: _Optional[str] = ..., action: _Optional[_Union[Action, str]] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class RuleResult(_message.Message):
    __slots__ = ("rule", "status", "passed", "score", "threshold", "action", "evaluators", "fallback_used", "reason", "latency_ms", "outcome")
    RULE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    EVALUATORS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_USED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    rule: str
    status: Status
    passed: bool
    score: float
    threshold: float
    action: Action
    evaluators: _containers.RepeatedCompositeFieldContainer[EvaluatorResult]
    fallback_used: bool
    reason: str
    latency_ms: float
    outcome: ActionOutcome
    def __init__(self, rule: _Optional[str] = ..., status: _Optional[_Union[Status, str]] = ..., passed: _Optional[bool] = ..., score: _Optional[float] = ..., threshold: _Optional[float] = ..., action: _Optional[_Union[Action, str]] = ..., evaluators: _Optional[_Iterable[_Union[EvaluatorResult, _Mapping]]] = ..., fallback_used: _Optional[bool] = ..., reason: _Optional[str] = ..., latency_ms: _Optional[float] = ..., outcome: _Optional[_Union[ActionOutcome, _Mapping]] = ...) -> None: ...

class EvaluateResponse(_message.Message):
    __slots__ = ("decision_id", "policy", "policy_version", "policy_revision", "environment", "passed", "action", "rules", "modified_response", "outcomes", "errored_rules", "latency_ms", "review_ids", "request_id", "stage", "tool_name", "tool_call_id")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_REVISION_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    MODIFIED_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    ERRORED_RULES_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    REVIEW_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    policy: str
    policy_version: str
    policy_revision: int
    environment: str
    passed: bool
    action: Action
    rules: _containers.RepeatedCompositeFieldContainer[RuleResult]
    modified_response: str
    outcomes: _containers.RepeatedCompositeFieldContainer[ActionOutcome]
    errored_rules: _containers.RepeatedScalarFieldContainer[str]
    latency_ms: float
    review_ids: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    stage: str
    tool_name: str
    tool_call_id: str
    def __init__(self, decision_id: _Optional[str] = ..., policy: _Optional[str] = ..., policy_version: _Optional[str] = ..., policy_revision: _Optional[int] = ..., environment: _Optional[str] = ..., passed: _Optional[bool] = ..., action: _Optional[_Union[Action, str]] = ..., rules: _Optional[_Iterable[_Union[RuleResult, _Mapping]]] = ..., modified_response: _Optional[str] = ..., outcomes: _Optional[_Iterable[_Union[ActionOutcome, _Mapping]]] = ..., errored_rules: _Optional[_Iterable[str]] = ..., latency_ms: _Optional[float] = ..., review_ids: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ..., stage: _Optional[str] = ..., tool_name: _Optional[str] = ..., tool_call_id: _Optional[str] = ...) -> None: ...

class ItemError(_message.Message):
    __slots__ = ("code", "message", "retryable", "error_type", "detail")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    retryable: bool
    error_type: str
    detail: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., retryable: _Optional[bool] = ..., error_type: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class EvaluateStreamResponse(_message.Message):
    __slots__ = ("request_id", "decision", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    decision: EvaluateResponse
    error: ItemError
    def __init__(self, request_id: _Optional[str] = ..., decision: _Optional[_Union[EvaluateResponse, _Mapping]] = ..., error: _Optional[_Union[ItemError, _Mapping]] = ...) -> None: ...

class SubmitFeedbackRequest(_message.Message):
    __slots__ = ("decision_id", "rule", "label", "comment")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    rule: str
    label: str
    comment: str
    def __init__(self, decision_id: _Optional[str] = ..., rule: _Optional[str] = ..., label: _Optional[str] = ..., comment: _Optional[str] = ...) -> None: ...

class SubmitFeedbackResponse(_message.Message):
    __slots__ = ("feedback_id",)
    FEEDBACK_ID_FIELD_NUMBER: _ClassVar[int]
    feedback_id: str
    def __init__(self, feedback_id: _Optional[str] = ...) -> None: ...
