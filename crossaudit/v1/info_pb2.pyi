from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("version", "tenant", "multi_tenant", "sandbox_backend", "isolation", "weaker_isolation")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MULTI_TENANT_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_BACKEND_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    WEAKER_ISOLATION_FIELD_NUMBER: _ClassVar[int]
    version: str
    tenant: str
    multi_tenant: bool
    sandbox_backend: str
    isolation: str
    weaker_isolation: bool
    def __init__(self, version: _Optional[str] = ..., tenant: _Optional[str] = ..., multi_tenant: _Optional[bool] = ..., sandbox_backend: _Optional[str] = ..., isolation: _Optional[str] = ..., weaker_isolation: _Optional[bool] = ...) -> None: ...
