"""How a client connects: default deadlines, message caps, TLS credentials and the API key."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

import grpc

from crossaudit.kernel.errors import InvalidInputError

DEFAULT_CALL_TIMEOUT_S = 30.0  # deadline of calls other than evaluate/upload when none is given
DEFAULT_UPLOAD_TIMEOUT_S = 1_800.0  # an upload may build an image
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
ProgressCallback = Callable[[str, float], None]  # (message, fraction 0..1) of an upload
TlsOption: TypeAlias = bool | grpc.ChannelCredentials | str | os.PathLike[str]


def credentials(tls: TlsOption) -> grpc.ChannelCredentials | None:
    """``tls``: False (plaintext), True (system roots), a CA file path, or ready credentials."""
    if tls is False or tls is None:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    try:
        return grpc.ssl_channel_credentials(root_certificates=Path(tls).read_bytes())
    except OSError as e:
        raise InvalidInputError(f"cannot read CA certificate {tls}: {e.strerror}") from None


def call_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()
