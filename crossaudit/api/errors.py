"""The service's side of the one error codec (``crossaudit/kernel/errcodec.py``).

Kept as the service's import point: servicers encode with :func:`to_status` / :func:`abort`,
the Python client decodes with :func:`from_rpc_error`. Invalid policies also carry
``google.rpc.BadRequest`` field violations (one per issue, ``file:line:col`` message).
"""

from __future__ import annotations

import grpc
from google.rpc import code_pb2

from crossaudit.kernel.errcodec import (
    ERROR_CODE,
    ERROR_DOC_KEY,
    ERROR_TYPE_KEY,
    INTERNAL_MESSAGE,
    RETRYABLE_KEY,
    abort,
    decode,
    encode,
    from_item,
    from_rpc_error,
    item_fields,
    status_code,
)
from crossaudit.kernel.errcodec import STATUS_CODE as GRPC_CODE

__all__ = [
    "ERROR_CODE",
    "ERROR_DOC_KEY",
    "ERROR_TYPE_KEY",
    "GRPC_CODE",
    "INTERNAL_MESSAGE",
    "RETRYABLE_KEY",
    "abort",
    "decode",
    "from_item",
    "from_rpc_error",
    "grpc_code",
    "item_fields",
    "to_status",
]

grpc_code = status_code
to_status = encode


assert grpc.StatusCode.INVALID_ARGUMENT.value[0] == code_pb2.INVALID_ARGUMENT
