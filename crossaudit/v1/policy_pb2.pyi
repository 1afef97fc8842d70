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
    __slots__ = ("content", "environment", "filename")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    content: str
    environment: str
    filename: str
    def __init__(self, content: _Optional[str] = ..., environment: _Optional[str] = ..., filename: _Optional[str] = ...) -> None: ...

class DeployPolicyResponse(_message.Message):
    __slots__ = ("version", "deployment", "created")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    version: PolicyVersion
    deployment: Deployment
    created: bool
    def __init__(self, version: _Optional[_Union[PolicyVersion, _Mapping]] = ..., deployment: _Optional[_Union[Deployment, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

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
