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
    __slots__ = ("decision_id", "policy", "policy_revision", "policy_version", "policy_digest", "environment", "passed", "action", "rules", "errored_rules", "latency_ms", "prompt_sha256", "response_sha256", "context_sha256", "modified_response_sha256", "created_at", "request_id", "prompt", "response", "truncated", "inputs_retained_until", "inputs_erased_at", "receipt", "log_seq", "leaf_hash", "trace_id", "span_id")
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
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    LOG_SEQ_FIELD_NUMBER: _ClassVar[int]
    LEAF_HASH_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    SPAN_ID_FIELD_NUMBER: _ClassVar[int]
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
    receipt: _struct_pb2.Struct
    log_seq: int
    leaf_hash: str
    trace_id: str
    span_id: str
    def __init__(self, decision_id: _Optional[str] = ..., policy: _Optional[str] = ..., policy_revision: _Optional[int] = ..., policy_version: _Optional[str] = ..., policy_digest: _Optional[str] = ..., environment: _Optional[str] = ..., passed: _Optional[bool] = ..., action: _Optional[str] = ..., rules: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., errored_rules: _Optional[_Iterable[str]] = ..., latency_ms: _Optional[float] = ..., prompt_sha256: _Optional[str] = ..., response_sha256: _Optional[str] = ..., context_sha256: _Optional[str] = ..., modified_response_sha256: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., request_id: _Optional[str] = ..., prompt: _Optional[str] = ..., response: _Optional[str] = ..., truncated: _Optional[str] = ..., inputs_retained_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., inputs_erased_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., receipt: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., log_seq: _Optional[int] = ..., leaf_hash: _Optional[str] = ..., trace_id: _Optional[str] = ..., span_id: _Optional[str] = ...) -> None: ...

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

class GetLogKeyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LogKey(_message.Message):
    __slots__ = ("log", "key_id", "vkey", "pem", "trusted_vkeys", "signing")
    LOG_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    VKEY_FIELD_NUMBER: _ClassVar[int]
    PEM_FIELD_NUMBER: _ClassVar[int]
    TRUSTED_VKEYS_FIELD_NUMBER: _ClassVar[int]
    SIGNING_FIELD_NUMBER: _ClassVar[int]
    log: str
    key_id: str
    vkey: str
    pem: str
    trusted_vkeys: _containers.RepeatedScalarFieldContainer[str]
    signing: bool
    def __init__(self, log: _Optional[str] = ..., key_id: _Optional[str] = ..., vkey: _Optional[str] = ..., pem: _Optional[str] = ..., trusted_vkeys: _Optional[_Iterable[str]] = ..., signing: _Optional[bool] = ...) -> None: ...

class ReadLogRequest(_message.Message):
    __slots__ = ("since", "until", "outside", "details")
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    OUTSIDE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    outside: bool
    details: bool
    def __init__(self, since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., outside: _Optional[bool] = ..., details: _Optional[bool] = ...) -> None: ...

class LogEntry(_message.Message):
    __slots__ = ("decision_id", "seq", "stored_leaf", "document", "rules", "receipt")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STORED_LEAF_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    seq: int
    stored_leaf: str
    document: bytes
    rules: str
    receipt: str
    def __init__(self, decision_id: _Optional[str] = ..., seq: _Optional[int] = ..., stored_leaf: _Optional[str] = ..., document: _Optional[bytes] = ..., rules: _Optional[str] = ..., receipt: _Optional[str] = ...) -> None: ...

class LogNode(_message.Message):
    __slots__ = ("lo", "hi", "hash")
    LO_FIELD_NUMBER: _ClassVar[int]
    HI_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    lo: int
    hi: int
    hash: bytes
    def __init__(self, lo: _Optional[int] = ..., hi: _Optional[int] = ..., hash: _Optional[bytes] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("log", "start", "frontier", "head", "checkpoints", "entries", "covering_checkpoint", "covering_proof", "last")
    LOG_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    FRONTIER_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COVERING_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    COVERING_PROOF_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    log: str
    start: int
    frontier: _containers.RepeatedScalarFieldContainer[str]
    head: int
    checkpoints: _containers.RepeatedScalarFieldContainer[str]
    entries: _containers.RepeatedCompositeFieldContainer[LogEntry]
    covering_checkpoint: str
    covering_proof: _containers.RepeatedCompositeFieldContainer[LogNode]
    last: bool
    def __init__(self, log: _Optional[str] = ..., start: _Optional[int] = ..., frontier: _Optional[_Iterable[str]] = ..., head: _Optional[int] = ..., checkpoints: _Optional[_Iterable[str]] = ..., entries: _Optional[_Iterable[_Union[LogEntry, _Mapping]]] = ..., covering_checkpoint: _Optional[str] = ..., covering_proof: _Optional[_Iterable[_Union[LogNode, _Mapping]]] = ..., last: _Optional[bool] = ...) -> None: ...

class GetInclusionProofRequest(_message.Message):
    __slots__ = ("decision_id",)
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    def __init__(self, decision_id: _Optional[str] = ...) -> None: ...

class InclusionProof(_message.Message):
    __slots__ = ("decision_id", "seq", "document", "leaf_hash", "tree_size", "path", "checkpoint")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    LEAF_HASH_FIELD_NUMBER: _ClassVar[int]
    TREE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    seq: int
    document: bytes
    leaf_hash: str
    tree_size: int
    path: _containers.RepeatedScalarFieldContainer[bytes]
    checkpoint: str
    def __init__(self, decision_id: _Optional[str] = ..., seq: _Optional[int] = ..., document: _Optional[bytes] = ..., leaf_hash: _Optional[str] = ..., tree_size: _Optional[int] = ..., path: _Optional[_Iterable[bytes]] = ..., checkpoint: _Optional[str] = ...) -> None: ...

class GetConsistencyProofRequest(_message.Message):
    __slots__ = ("old_size", "new_size")
    OLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    NEW_SIZE_FIELD_NUMBER: _ClassVar[int]
    old_size: int
    new_size: int
    def __init__(self, old_size: _Optional[int] = ..., new_size: _Optional[int] = ...) -> None: ...

class ConsistencyProof(_message.Message):
    __slots__ = ("old_checkpoint", "new_checkpoint", "path")
    OLD_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    NEW_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    old_checkpoint: str
    new_checkpoint: str
    path: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, old_checkpoint: _Optional[str] = ..., new_checkpoint: _Optional[str] = ..., path: _Optional[_Iterable[bytes]] = ...) -> None: ...

class GetReceiptRequest(_message.Message):
    __slots__ = ("decision_id",)
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    def __init__(self, decision_id: _Optional[str] = ...) -> None: ...

class Receipt(_message.Message):
    __slots__ = ("decision_id", "receipt", "log_seq", "leaf_hash", "log")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    LOG_SEQ_FIELD_NUMBER: _ClassVar[int]
    LEAF_HASH_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    receipt: _struct_pb2.Struct
    log_seq: int
    leaf_hash: str
    log: str
    def __init__(self, decision_id: _Optional[str] = ..., receipt: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., log_seq: _Optional[int] = ..., leaf_hash: _Optional[str] = ..., log: _Optional[str] = ...) -> None: ...

class ListLabelsRequest(_message.Message):
    __slots__ = ("policy", "environment", "since", "page_size", "page_token")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    policy: str
    environment: str
    since: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    def __init__(self, policy: _Optional[str] = ..., environment: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class LabelledDecision(_message.Message):
    __slots__ = ("source", "id", "decision_id", "rule", "label", "should_pass", "labelled_at", "decided_at", "scores", "thresholds", "recorded", "prompt", "response", "context", "retained")
    class ScoresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class ThresholdsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class RecordedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bool
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bool] = ...) -> None: ...
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SHOULD_PASS_FIELD_NUMBER: _ClassVar[int]
    LABELLED_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    RETAINED_FIELD_NUMBER: _ClassVar[int]
    source: str
    id: str
    decision_id: str
    rule: str
    label: str
    should_pass: bool
    labelled_at: _timestamp_pb2.Timestamp
    decided_at: _timestamp_pb2.Timestamp
    scores: _containers.ScalarMap[str, float]
    thresholds: _containers.ScalarMap[str, float]
    recorded: _containers.ScalarMap[str, bool]
    prompt: str
    response: str
    context: _struct_pb2.Struct
    retained: bool
    def __init__(self, source: _Optional[str] = ..., id: _Optional[str] = ..., decision_id: _Optional[str] = ..., rule: _Optional[str] = ..., label: _Optional[str] = ..., should_pass: _Optional[bool] = ..., labelled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., scores: _Optional[_Mapping[str, float]] = ..., thresholds: _Optional[_Mapping[str, float]] = ..., recorded: _Optional[_Mapping[str, bool]] = ..., prompt: _Optional[str] = ..., response: _Optional[str] = ..., context: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., retained: _Optional[bool] = ...) -> None: ...

class ListLabelsResponse(_message.Message):
    __slots__ = ("labels", "next_page_token")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[LabelledDecision]
    next_page_token: str
    def __init__(self, labels: _Optional[_Iterable[_Union[LabelledDecision, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
