from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AnalyzeRequest(_message.Message):
    __slots__ = ("model", "config_json", "prompt", "response", "context_json")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_JSON_FIELD_NUMBER: _ClassVar[int]
    model: str
    config_json: str
    prompt: str
    response: str
    context_json: str
    def __init__(self, model: _Optional[str] = ..., config_json: _Optional[str] = ..., prompt: _Optional[str] = ..., response: _Optional[str] = ..., context_json: _Optional[str] = ...) -> None: ...

class TextSpan(_message.Message):
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

class AnalyzeReply(_message.Message):
    __slots__ = ("score", "passed", "violations", "details_json", "spans", "model_ms", "provenance")
    class ProvenanceEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SCORE_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    DETAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    MODEL_MS_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    score: float
    passed: bool
    violations: _containers.RepeatedScalarFieldContainer[str]
    details_json: str
    spans: _containers.RepeatedCompositeFieldContainer[TextSpan]
    model_ms: float
    provenance: _containers.ScalarMap[str, str]
    def __init__(self, score: _Optional[float] = ..., passed: _Optional[bool] = ..., violations: _Optional[_Iterable[str]] = ..., details_json: _Optional[str] = ..., spans: _Optional[_Iterable[_Union[TextSpan, _Mapping]]] = ..., model_ms: _Optional[float] = ..., provenance: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ModelHealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelHealthReply(_message.Message):
    __slots__ = ("ready", "model", "pid", "loaded", "load_ms", "requests", "batch_sizes", "expired")
    class BatchSizesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    READY_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    LOAD_MS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZES_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    model: str
    pid: int
    loaded: _containers.RepeatedScalarFieldContainer[str]
    load_ms: float
    requests: int
    batch_sizes: _containers.ScalarMap[int, int]
    expired: int
    def __init__(self, ready: _Optional[bool] = ..., model: _Optional[str] = ..., pid: _Optional[int] = ..., loaded: _Optional[_Iterable[str]] = ..., load_ms: _Optional[float] = ..., requests: _Optional[int] = ..., batch_sizes: _Optional[_Mapping[int, int]] = ..., expired: _Optional[int] = ...) -> None: ...
