import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PolicyIssue(_message.Message):
    __slots__ = ("message", "path", "file", "line", "column")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    message: str
    path: str
    file: str
    line: int
    column: int
    def __init__(self, message: _Optional[str] = ..., path: _Optional[str] = ..., file: _Optional[str] = ..., line: _Optional[int] = ..., column: _Optional[int] = ...) -> None: ...

class PolicyVersion(_message.Message):
    __slots__ = ("name", "version", "declared_version", "digest", "description", "created_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DECLARED_VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    declared_version: str
    digest: str
    description: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., declared_version: _Optional[str] = ..., digest: _Optional[str] = ..., description: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Deployment(_message.Message):
    __slots__ = ("name", "environment", "version", "deployed_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DEPLOYED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    environment: str
    version: int
    deployed_at: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., environment: _Optional[str] = ..., version: _Optional[int] = ..., deployed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ValidatePolicyRequest(_message.Message):
    __slots__ = ("content", "filename")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    content: str
    filename: str
    def __init__(self, content: _Optional[str] = ..., filename: _Optional[str] = ...) -> None: ...

class ValidatePolicyResponse(_message.Message):
    __slots__ = ("valid", "issues", "name", "declared_version", "rule_count", "evaluator_count")
    VALID_FIELD_NUMBER: _ClassVar[int]
    ISSUES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DECLARED_VERSION_FIELD_NUMBER: _ClassVar[int]
    RULE_COUNT_FIELD_NUMBER: _ClassVar[int]
    EVALUATOR_COUNT_FIELD_NUMBER: _ClassVar[int]
    valid: bool
    issues: _containers.RepeatedCompositeFieldContainer[PolicyIssue]
    name: str
    declared_version: str
    rule_count: int
    evaluator_count: int
    def __init__(self, valid: _Optional[bool] = ..., issues: _Optional[_Iterable[_Union[PolicyIssue, _Mapping]]] = ..., name: _Optional[str] = ..., declared_version: _Optional[str] = ..., rule_count: _Optional[int] = ..., evaluator_count: _Optional[int] = ...) -> None: ...

class DeployPolicyRequest(_message.Message):
    __slots__ = ("content", "environment", "filename", "candidate")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    content: str
    environment: str
    filename: str
    candidate: CandidateOptions
    def __init__(self, content: _Optional[str] = ..., environment: _Optional[str] = ..., filename: _Optional[str] = ..., candidate: _Optional[_Union[CandidateOptions, _Mapping]] = ...) -> None: ...

class CandidateOptions(_message.Message):
    __slots__ = ("mode", "share", "canary_key", "notify_url")
    MODE_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    CANARY_KEY_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_URL_FIELD_NUMBER: _ClassVar[int]
    mode: str
    share: float
    canary_key: str
    notify_url: str
    def __init__(self, mode: _Optional[str] = ..., share: _Optional[float] = ..., canary_key: _Optional[str] = ..., notify_url: _Optional[str] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("name", "environment", "mode", "version", "active_version", "share", "canary_key", "notify_url", "state", "started_at", "ended_at", "reason", "bounds", "id")
    class BoundsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    CANARY_KEY_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_URL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BOUNDS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    environment: str
    mode: str
    version: int
    active_version: int
    share: float
    canary_key: str
    notify_url: str
    state: str
    started_at: _timestamp_pb2.Timestamp
    ended_at: _timestamp_pb2.Timestamp
    reason: str
    bounds: _containers.ScalarMap[str, float]
    id: str
    def __init__(self, name: _Optional[str] = ..., environment: _Optional[str] = ..., mode: _Optional[str] = ..., version: _Optional[int] = ..., active_version: _Optional[int] = ..., share: _Optional[float] = ..., canary_key: _Optional[str] = ..., notify_url: _Optional[str] = ..., state: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ended_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., bounds: _Optional[_Mapping[str, float]] = ..., id: _Optional[str] = ...) -> None: ...

class DeployPolicyResponse(_message.Message):
    __slots__ = ("version", "deployment", "created", "candidate")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    version: PolicyVersion
    deployment: Deployment
    created: bool
    candidate: Candidate
    def __init__(self, version: _Optional[_Union[PolicyVersion, _Mapping]] = ..., deployment: _Optional[_Union[Deployment, _Mapping]] = ..., created: _Optional[bool] = ..., candidate: _Optional[_Union[Candidate, _Mapping]] = ...) -> None: ...

class DeployProgress(_message.Message):
    __slots__ = ("message", "fraction")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    message: str
    fraction: float
    def __init__(self, message: _Optional[str] = ..., fraction: _Optional[float] = ...) -> None: ...

class DeployPolicyEvent(_message.Message):
    __slots__ = ("progress", "result")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    progress: DeployProgress
    result: DeployPolicyResponse
    def __init__(self, progress: _Optional[_Union[DeployProgress, _Mapping]] = ..., result: _Optional[_Union[DeployPolicyResponse, _Mapping]] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ("name", "environment", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    environment: str
    version: int
    def __init__(self, name: _Optional[str] = ..., environment: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class GetPolicyResponse(_message.Message):
    __slots__ = ("version", "content", "deployments")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    version: PolicyVersion
    content: str
    deployments: _containers.RepeatedCompositeFieldContainer[Deployment]
    def __init__(self, version: _Optional[_Union[PolicyVersion, _Mapping]] = ..., content: _Optional[str] = ..., deployments: _Optional[_Iterable[_Union[Deployment, _Mapping]]] = ...) -> None: ...

class ListPoliciesRequest(_message.Message):
    __slots__ = ("environment",)
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    environment: str
    def __init__(self, environment: _Optional[str] = ...) -> None: ...

class PolicySummary(_message.Message):
    __slots__ = ("name", "latest_version", "deployments")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    latest_version: int
    deployments: _containers.RepeatedCompositeFieldContainer[Deployment]
    def __init__(self, name: _Optional[str] = ..., latest_version: _Optional[int] = ..., deployments: _Optional[_Iterable[_Union[Deployment, _Mapping]]] = ...) -> None: ...

class ListPoliciesResponse(_message.Message):
    __slots__ = ("policies",)
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    policies: _containers.RepeatedCompositeFieldContainer[PolicySummary]
    def __init__(self, policies: _Optional[_Iterable[_Union[PolicySummary, _Mapping]]] = ...) -> None: ...

class RollbackPolicyRequest(_message.Message):
    __slots__ = ("name", "environment", "to_version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    environment: str
    to_version: int
    def __init__(self, name: _Optional[str] = ..., environment: _Optional[str] = ..., to_version: _Optional[int] = ...) -> None: ...

class RollbackPolicyResponse(_message.Message):
    __slots__ = ("deployment", "previous_version")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    deployment: Deployment
    previous_version: int
    def __init__(self, deployment: _Optional[_Union[Deployment, _Mapping]] = ..., previous_version: _Optional[int] = ...) -> None: ...

class PromotePolicyRequest(_message.Message):
    __slots__ = ("name", "environment")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    environment: str
    def __init__(self, name: _Optional[str] = ..., environment: _Optional[str] = ...) -> None: ...

class PromotePolicyResponse(_message.Message):
    __slots__ = ("deployment", "candidate")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    deployment: Deployment
    candidate: Candidate
    def __init__(self, deployment: _Optional[_Union[Deployment, _Mapping]] = ..., candidate: _Optional[_Union[Candidate, _Mapping]] = ...) -> None: ...

class DiscardCandidateRequest(_message.Message):
    __slots__ = ("name", "environment")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    environment: str
    def __init__(self, name: _Optional[str] = ..., environment: _Optional[str] = ...) -> None: ...

class DiscardCandidateResponse(_message.Message):
    __slots__ = ("candidate",)
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    candidate: Candidate
    def __init__(self, candidate: _Optional[_Union[Candidate, _Mapping]] = ...) -> None: ...

class ShadowReportRequest(_message.Message):
    __slots__ = ("name", "environment")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    environment: str
    def __init__(self, name: _Optional[str] = ..., environment: _Optional[str] = ...) -> None: ...

class RuleDiff(_message.Message):
    __slots__ = ("rule", "live_status", "live_score", "candidate_status", "candidate_score", "flipped", "live_action", "candidate_action")
    RULE_FIELD_NUMBER: _ClassVar[int]
    LIVE_STATUS_FIELD_NUMBER: _ClassVar[int]
    LIVE_SCORE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_STATUS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_SCORE_FIELD_NUMBER: _ClassVar[int]
    FLIPPED_FIELD_NUMBER: _ClassVar[int]
    LIVE_ACTION_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ACTION_FIELD_NUMBER: _ClassVar[int]
    rule: str
    live_status: str
    live_score: float
    candidate_status: str
    candidate_score: float
    flipped: bool
    live_action: str
    candidate_action: str
    def __init__(self, rule: _Optional[str] = ..., live_status: _Optional[str] = ..., live_score: _Optional[float] = ..., candidate_status: _Optional[str] = ..., candidate_score: _Optional[float] = ..., flipped: _Optional[bool] = ..., live_action: _Optional[str] = ..., candidate_action: _Optional[str] = ...) -> None: ...

class ShadowDiff(_message.Message):
    __slots__ = ("decision_id", "created_at", "live_passed", "live_action", "candidate_passed", "candidate_action", "error", "rules")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LIVE_PASSED_FIELD_NUMBER: _ClassVar[int]
    LIVE_ACTION_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_PASSED_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ACTION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    created_at: _timestamp_pb2.Timestamp
    live_passed: bool
    live_action: str
    candidate_passed: bool
    candidate_action: str
    error: str
    rules: _containers.RepeatedCompositeFieldContainer[RuleDiff]
    def __init__(self, decision_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., live_passed: _Optional[bool] = ..., live_action: _Optional[str] = ..., candidate_passed: _Optional[bool] = ..., candidate_action: _Optional[str] = ..., error: _Optional[str] = ..., rules: _Optional[_Iterable[_Union[RuleDiff, _Mapping]]] = ...) -> None: ...

class HistoryEntry(_message.Message):
    __slots__ = ("version", "kind", "at")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    version: int
    kind: str
    at: _timestamp_pb2.Timestamp
    def __init__(self, version: _Optional[int] = ..., kind: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RevisionCounts(_message.Message):
    __slots__ = ("decisions", "errored", "blocked")
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    ERRORED_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_FIELD_NUMBER: _ClassVar[int]
    decisions: int
    errored: int
    blocked: int
    def __init__(self, decisions: _Optional[int] = ..., errored: _Optional[int] = ..., blocked: _Optional[int] = ...) -> None: ...

class ShadowReportResponse(_message.Message):
    __slots__ = ("candidate", "evaluated", "agreed", "pass_to_fail", "fail_to_pass", "action_changes", "errors", "dropped", "diffs_stored", "rule_flips", "samples", "history", "canary", "active")
    class RuleFlipsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    EVALUATED_FIELD_NUMBER: _ClassVar[int]
    AGREED_FIELD_NUMBER: _ClassVar[int]
    PASS_TO_FAIL_FIELD_NUMBER: _ClassVar[int]
    FAIL_TO_PASS_FIELD_NUMBER: _ClassVar[int]
    ACTION_CHANGES_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    DIFFS_STORED_FIELD_NUMBER: _ClassVar[int]
    RULE_FLIPS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    candidate: Candidate
    evaluated: int
    agreed: int
    pass_to_fail: int
    fail_to_pass: int
    action_changes: int
    errors: int
    dropped: int
    diffs_stored: int
    rule_flips: _containers.ScalarMap[str, int]
    samples: _containers.RepeatedCompositeFieldContainer[ShadowDiff]
    history: _containers.RepeatedCompositeFieldContainer[HistoryEntry]
    canary: RevisionCounts
    active: RevisionCounts
    def __init__(self, candidate: _Optional[_Union[Candidate, _Mapping]] = ..., evaluated: _Optional[int] = ..., agreed: _Optional[int] = ..., pass_to_fail: _Optional[int] = ..., fail_to_pass: _Optional[int] = ..., action_changes: _Optional[int] = ..., errors: _Optional[int] = ..., dropped: _Optional[int] = ..., diffs_stored: _Optional[int] = ..., rule_flips: _Optional[_Mapping[str, int]] = ..., samples: _Optional[_Iterable[_Union[ShadowDiff, _Mapping]]] = ..., history: _Optional[_Iterable[_Union[HistoryEntry, _Mapping]]] = ..., canary: _Optional[_Union[RevisionCounts, _Mapping]] = ..., active: _Optional[_Union[RevisionCounts, _Mapping]] = ...) -> None: ...
