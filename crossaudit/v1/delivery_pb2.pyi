import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeliveryState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVERY_STATE_UNSPECIFIED: _ClassVar[DeliveryState]
    DELIVERY_STATE_PENDING: _ClassVar[DeliveryState]
    DELIVERY_STATE_DELIVERED: _ClassVar[DeliveryState]
    DELIVERY_STATE_DEAD: _ClassVar[DeliveryState]
DELIVERY_STATE_UNSPECIFIED: DeliveryState
DELIVERY_STATE_PENDING: DeliveryState
DELIVERY_STATE_DELIVERED: DeliveryState
DELIVERY_STATE_DEAD: DeliveryState

class Delivery(_message.Message):
    __slots__ = ("id", "decision_id", "rule", "url", "method", "state", "attempts", "next_attempt_at", "last_error", "last_status", "created_at", "delivered_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_STATUS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    decision_id: str
    rule: str
    url: str
    method: str
    state: DeliveryState
    attempts: int
    next_attempt_at: _timestamp_pb2.Timestamp
    last_error: str
    last_status: int
    created_at: _timestamp_pb2.Timestamp
    delivered_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., decision_id: _Optional[str] = ..., rule: _Optional[str] = ..., url: _Optional[str] = ..., method: _Optional[str] = ..., state: _Optional[_Union[DeliveryState, str]] = ..., attempts: _Optional[int] = ..., next_attempt_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_error: _Optional[str] = ..., last_status: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., delivered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListDeliveriesRequest(_message.Message):
    __slots__ = ("state", "limit")
    STATE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    state: DeliveryState
    limit: int
    def __init__(self, state: _Optional[_Union[DeliveryState, str]] = ..., limit: _Optional[int] = ...) -> None: ...

class ListDeliveriesResponse(_message.Message):
    __slots__ = ("deliveries",)
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ...) -> None: ...

class RedeliverDeliveryRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...
