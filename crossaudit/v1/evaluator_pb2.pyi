import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Evaluator(_message.Message):
    __slots__ = ("id", "name", "version", "language", "dependencies", "digest", "created_at", "code", "description")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    version: int
    language: str
    dependencies: _containers.RepeatedScalarFieldContainer[str]
    digest: str
    created_at: _timestamp_pb2.Timestamp
    code: str
    description: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[int] = ..., language: _Optional[str] = ..., dependencies: _Optional[_Iterable[str]] = ..., digest: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., code: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class UploadEvaluatorRequest(_message.Message):
    __slots__ = ("name", "code", "language", "dependencies", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    code: str
    language: str
    dependencies: _containers.RepeatedScalarFieldContainer[str]
    description: str
    def __init__(self, name: _Optional[str] = ..., code: _Optional[str] = ..., language: _Optional[str] = ..., dependencies: _Optional[_Iterable[str]] = ..., description: _Optional[str] = ...) -> None: ...

class UploadProgress(_message.Message):
    __slots__ = ("message", "fraction")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    message: str
    fraction: float
    def __init__(self, message: _Optional[str] = ..., fraction: _Optional[float] = ...) -> None: ...

class UploadEvaluatorEvent(_message.Message):
    __slots__ = ("progress", "evaluator", "created")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    EVALUATOR_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    progress: UploadProgress
    evaluator: Evaluator
    created: bool
    def __init__(self, progress: _Optional[_Union[UploadProgress, _Mapping]] = ..., evaluator: _Optional[_Union[Evaluator, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetEvaluatorRequest(_message.Message):
    __slots__ = ("id", "name", "version", "include_code")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_CODE_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    version: int
    include_code: bool
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[int] = ..., include_code: _Optional[bool] = ...) -> None: ...

class ListEvaluatorsRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListEvaluatorsResponse(_message.Message):
    __slots__ = ("evaluators",)
    EVALUATORS_FIELD_NUMBER: _ClassVar[int]
    evaluators: _containers.RepeatedCompositeFieldContainer[Evaluator]
    def __init__(self, evaluators: _Optional[_Iterable[_Union[Evaluator, _Mapping]]] = ...) -> None: ...
