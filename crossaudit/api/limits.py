"""What client and server agree on without asking each other: the default environment and the
request size limit (its setting, its variable and the transport's margin above it)."""

from __future__ import annotations

# The one default environment: what the server assumes when a request names none, what the CLI
# and the SDK send by default, and where policies/*.yaml are deployed on a data dir's first
# start. One value, so `crossaudit serve --dev` then `crossaudit evaluate NAME --server` finds
# the policy (docs/service.md, "Environments").
DEFAULT_ENVIRONMENT = "production"


REQUEST_LIMIT_KEY = "limits.max_request_bytes"  # ServiceLimits.max_request_bytes as a setting


REQUEST_LIMIT_ENV = "CROSSAUDIT_LIMITS__MAX_REQUEST_BYTES"  # ... and its variable (server, SDK, CLI)


# gRPC's own cap on a received message is set this far above max_request_bytes, so a request a
# little too large reaches the handler and gets the typed refusal naming the setting rather
# than grpc's "Received message larger than max" (which names nothing).
TRANSPORT_MARGIN_BYTES = 1024 * 1024


# One request, everywhere (limits.max_request_bytes): the server refuses a larger one, the SDK and CLI
# refuse to send one. A client reads REQUEST_LIMIT_ENV where the server's limit was raised.
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
