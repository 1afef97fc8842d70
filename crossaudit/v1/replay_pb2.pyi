from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplayRequest(_message.Message):
    __slots__ = ("content", "filename", "against", "environment", "since", "until", "limit", "rerun_llm", "samples", "estimate_only")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    AGAINST_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    RERUN_LLM_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    content: str
    filename: str
    against: str
    environment: str
    since: float
    until: float
    limit: int
    rerun_llm: bool
    samples: int
    estimate_only: bool
    def __init__(self, content: _Optional[str] = ..., filename: _Optional[str] = ..., against: _Optional[str] = ..., environment: _Optional[str] = ..., since: _Optional[float] = ..., until: _Optional[float] = ..., limit: _Optional[int] = ..., rerun_llm: _Optional[bool] = ..., samples: _Optional[int] = ..., estimate_only: _Optional[bool] = ...) -> None: ...

class ReplayProgress(_message.Message):
    __slots__ = ("read", "replayed", "not_replayable", "limit", "message")
    READ_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    NOT_REPLAYABLE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    read: int
    replayed: int
    not_replayable: int
    limit: int
    message: str
    def __init__(self, read: _Optional[int] = ..., replayed: _Optional[int] = ..., not_replayable: _Optional[int] = ..., limit: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ReplaySamples(_message.Message):
    __slots__ = ("count", "decision_ids")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DECISION_IDS_FIELD_NUMBER: _ClassVar[int]
    count: int
    decision_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, count: _Optional[int] = ..., decision_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReplayRuleDiff(_message.Message):
    __slots__ = ("rule", "change", "compared", "pass_to_fail", "fail_to_pass", "score_shifts", "mean_shift", "max_shift")
    RULE_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    COMPARED_FIELD_NUMBER: _ClassVar[int]
    PASS_TO_FAIL_FIELD_NUMBER: _ClassVar[int]
    FAIL_TO_PASS_FIELD_NUMBER: _ClassVar[int]
    SCORE_SHIFTS_FIELD_NUMBER: _ClassVar[int]
    MEAN_SHIFT_FIELD_NUMBER: _ClassVar[int]
    MAX_SHIFT_FIELD_NUMBER: _ClassVar[int]
    rule: str
    change: str
    compared: int
    pass_to_fail: ReplaySamples
    fail_to_pass: ReplaySamples
    score_shifts: ReplaySamples
    mean_shift: float
    max_shift: float
    def __init__(self, rule: _Optional[str] = ..., change: _Optional[str] = ..., compared: _Optional[int] = ..., pass_to_fail: _Optional[_Union[ReplaySamples, _Mapping]] = ..., fail_to_pass: _Optional[_Union[ReplaySamples, _Mapping]] = ..., score_shifts: _Optional[_Union[ReplaySamples, _Mapping]] = ..., mean_shift: _Optional[float] = ..., max_shift: _Optional[float] = ...) -> None: ...

class LLMEstimate(_message.Message):
    __slots__ = ("calls", "decisions", "prompt_tokens", "completion_tokens", "cost_usd", "unpriced_models")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    UNPRICED_MODELS_FIELD_NUMBER: _ClassVar[int]
    calls: int
    decisions: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    unpriced_models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, calls: _Optional[int] = ..., decisions: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cost_usd: _Optional[float] = ..., unpriced_models: _Optional[_Iterable[str]] = ...) -> None: ...

class ReplayReport(_message.Message):
    __slots__ = ("policy", "candidate", "environment", "since", "until", "read", "replayed", "unchanged", "changed", "pass_to_fail", "fail_to_pass", "action_changes", "not_replayable", "rules", "more", "evaluator_runs", "hint", "estimate")
    class ActionChangesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ReplaySamples
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ReplaySamples, _Mapping]] = ...) -> None: ...
    class NotReplayableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ReplaySamples
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ReplaySamples, _Mapping]] = ...) -> None: ...
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    PASS_TO_FAIL_FIELD_NUMBER: _ClassVar[int]
    FAIL_TO_PASS_FIELD_NUMBER: _ClassVar[int]
    ACTION_CHANGES_FIELD_NUMBER: _ClassVar[int]
    NOT_REPLAYABLE_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    EVALUATOR_RUNS_FIELD_NUMBER: _ClassVar[int]
    HINT_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    policy: str
    candidate: str
    environment: str
    since: float
    until: float
    read: int
    replayed: int
    unchanged: int
    changed: ReplaySamples
    pass_to_fail: ReplaySamples
    fail_to_pass: ReplaySamples
    action_changes: _containers.MessageMap[str, ReplaySamples]
    not_replayable: _containers.MessageMap[str, ReplaySamples]
    rules: _containers.RepeatedCompositeFieldContainer[ReplayRuleDiff]
    more: bool
    evaluator_runs: int
    hint: str
    estimate: LLMEstimate
    def __init__(self, policy: _Optional[str] = ..., candidate: _Optional[str] = ..., environment: _Optional[str] = ..., since: _Optional[float] = ..., until: _Optional[float] = ..., read: _Optional[int] = ..., replayed: _Optional[int] = ..., unchanged: _Optional[int] = ..., changed: _Optional[_Union[ReplaySamples, _Mapping]] = ..., pass_to_fail: _Optional[_Union[ReplaySamples, _Mapping]] = ..., fail_to_pass: _Optional[_Union[ReplaySamples, _Mapping]] = ..., action_changes: _Optional[_Mapping[str, ReplaySamples]] = ..., not_replayable: _Optional[_Mapping[str, ReplaySamples]] = ..., rules: _Optional[_Iterable[_Union[ReplayRuleDiff, _Mapping]]] = ..., more: _Optional[bool] = ..., evaluator_runs: _Optional[int] = ..., hint: _Optional[str] = ..., estimate: _Optional[_Union[LLMEstimate, _Mapping]] = ...) -> None: ...

class ReplayEvent(_message.Message):
    __slots__ = ("progress", "report")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    progress: ReplayProgress
    report: ReplayReport
    def __init__(self, progress: _Optional[_Union[ReplayProgress, _Mapping]] = ..., report: _Optional[_Union[ReplayReport, _Mapping]] = ...) -> None: ...
