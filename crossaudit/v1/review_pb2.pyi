import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReviewKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REVIEW_KIND_UNSPECIFIED: _ClassVar[ReviewKind]
    REVIEW_KIND_REQUIRE_REVIEW: _ClassVar[ReviewKind]
    REVIEW_KIND_FLAG: _ClassVar[ReviewKind]

class ReviewState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REVIEW_STATE_UNSPECIFIED: _ClassVar[ReviewState]
    REVIEW_STATE_OPEN: _ClassVar[ReviewState]
    REVIEW_STATE_APPROVED: _ClassVar[ReviewState]
    REVIEW_STATE_REJECTED: _ClassVar[ReviewState]
    REVIEW_STATE_DISMISSED: _ClassVar[ReviewState]
REVIEW_KIND_UNSPECIFIED: ReviewKind
REVIEW_KIND_REQUIRE_REVIEW: ReviewKind
REVIEW_KIND_FLAG: ReviewKind
REVIEW_STATE_UNSPECIFIED: ReviewState
REVIEW_STATE_OPEN: ReviewState
REVIEW_STATE_APPROVED: ReviewState
REVIEW_STATE_REJECTED: ReviewState
REVIEW_STATE_DISMISSED: ReviewState

class Review(_message.Message):
    __slots__ = ("id", "decision_id", "policy", "policy_revision", "environment", "rule", "kind", "state", "params", "created_at", "resolved_at", "reviewer", "note", "escalated", "overdue")
    ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_REVISION_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_AT_FIELD_NUMBER: _ClassVar[int]
    REVIEWER_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    ESCALATED_FIELD_NUMBER: _ClassVar[int]
    OVERDUE_FIELD_NUMBER: _ClassVar[int]
    id: str
    decision_id: str
    policy: str
    policy_revision: int
    environment: str
    rule: str
    kind: ReviewKind
    state: ReviewState
    params: _struct_pb2.Struct
    created_at: _timestamp_pb2.Timestamp
    resolved_at: _timestamp_pb2.Timestamp
    reviewer: str
    note: str
    escalated: bool
    overdue: bool
    def __init__(self, id: _Optional[str] = ..., decision_id: _Optional[str] = ..., policy: _Optional[str] = ..., policy_revision: _Optional[int] = ..., environment: _Optional[str] = ..., rule: _Optional[str] = ..., kind: _Optional[_Union[ReviewKind, str]] = ..., state: _Optional[_Union[ReviewState, str]] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resolved_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reviewer: _Optional[str] = ..., note: _Optional[str] = ..., escalated: _Optional[bool] = ..., overdue: _Optional[bool] = ...) -> None: ...

class ListReviewsRequest(_message.Message):
    __slots__ = ("state", "policy", "limit")
    STATE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    state: ReviewState
    policy: str
    limit: int
    def __init__(self, state: _Optional[_Union[ReviewState, str]] = ..., policy: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListReviewsResponse(_message.Message):
    __slots__ = ("reviews",)
    REVIEWS_FIELD_NUMBER: _ClassVar[int]
    reviews: _containers.RepeatedCompositeFieldContainer[Review]
    def __init__(self, reviews: _Optional[_Iterable[_Union[Review, _Mapping]]] = ...) -> None: ...

class ResolveReviewRequest(_message.Message):
    __slots__ = ("id", "state", "reviewer", "note")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REVIEWER_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: ReviewState
    reviewer: str
    note: str
    def __init__(self, id: _Optional[str] = ..., state: _Optional[_Union[ReviewState, str]] = ..., reviewer: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...
