import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DecisionRecord(_message.Message):
    __slots__ = ("decision_id", "policy", "policy_revision", "policy_version", "policy_digest", "environment", "passed", "action", "rules", "errored_rules", "latency_ms", "prompt_sha256", "response_sha256", "context_sha256", "modified_response_sha256", "created_at", "request_id", "prompt", "response", "truncated", "inputs_retained_until", "inputs_erased_at")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_REVISION_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_DIGEST_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    ERRORED_RULES_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_SHA256_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_SHA256_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_SHA256_FIELD_NUMBER: _ClassVar[int]
    MODIFIED_RESPONSE_SHA256_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    INPUTS_RETAINED_UNTIL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_ERASED_AT_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    policy: str
    policy_revision: int
    policy_version: str
    policy_digest: str
    environment: str
    passed: bool
    action: str
    rules: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    errored_rules: _containers.RepeatedScalarFieldContainer[str]
    latency_ms: float
    prompt_sha256: str
    response_sha256: str
    context_sha256: str
    modified_response_sha256: str
    created_at: _timestamp_pb2.Timestamp
    request_id: str
    prompt: str
    response: str
    truncated: str
    inputs_retained_until: _timestamp_pb2.Timestamp
    inputs_erased_at: _timestamp_pb2.Timestamp
    def __init__(self, decision_id: _Optional[str] = ..., policy: _Optional[str] = ..., policy_revision: _Optional[int] = ..., policy_version: _Optional[str] = ..., policy_digest: _Optional[str] = ..., environment: _Optional[str] = ..., passed: _Optional[bool] = ..., action: _Optional[str] = ..., rules: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., errored_rules: _Optional[_Iterable[str]] = ..., latency_ms: _Optional[float] = ..., prompt_sha256: _Optional[str] = ..., response_sha256: _Optional[str] = ..., context_sha256: _Optional[str] = ..., modified_response_sha256: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., request_id: _Optional[str] = ..., prompt: _Optional[str] = ..., response: _Optional[str] = ..., truncated: _Optional[str] = ..., inputs_retained_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., inputs_erased_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetDecisionRequest(_message.Message):
    __slots__ = ("decision_id",)
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    def __init__(self, decision_id: _Optional[str] = ...) -> None: ...

class ListDecisionsRequest(_message.Message):
    __slots__ = ("policy", "limit")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    policy: str
    limit: int
    def __init__(self, policy: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListDecisionsResponse(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[DecisionRecord]
    def __init__(self, decisions: _Optional[_Iterable[_Union[DecisionRecord, _Mapping]]] = ...) -> None: ...

class ContextField(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class EraseInputsRequest(_message.Message):
    __slots__ = ("decision_id", "context_field")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    context_field: ContextField
    def __init__(self, decision_id: _Optional[str] = ..., context_field: _Optional[_Union[ContextField, _Mapping]] = ...) -> None: ...

class Erasure(_message.Message):
    __slots__ = ("id", "selector_kind", "selector_digest", "decisions", "created_at", "actor")
    ID_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_KIND_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_DIGEST_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    id: str
    selector_kind: str
    selector_digest: str
    decisions: int
    created_at: _timestamp_pb2.Timestamp
    actor: str
    def __init__(self, id: _Optional[str] = ..., selector_kind: _Optional[str] = ..., selector_digest: _Optional[str] = ..., decisions: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., actor: _Optional[str] = ...) -> None: ...
