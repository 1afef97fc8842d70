"""Checks of what callers name: ids, environments, labels. Shared by every part of the service so
that one name is refused the same way wherever it arrives."""

from __future__ import annotations

import re

from crossaudit.api.limits import DEFAULT_ENVIRONMENT
from crossaudit.kernel.dsl import NAME_PATTERN
from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.names import canonical_name

NAME = re.compile(NAME_PATTERN)  # evaluator names: the DSL's rule
ENVIRONMENT = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


def required(value: str, what: str, max_length: int) -> str:
    """``value`` when given and at most ``max_length`` characters."""
    if not value:
        raise InvalidInputError(f"{what} is required")
    if len(value) > max_length:
        raise InvalidInputError(f"{what} is longer than {max_length} characters")
    return value


def policy_name(value: str, max_length: int) -> str:
    """A policy name a caller looks up, in the canonical form policies are stored under (NFC,
    nothing invisible: crossaudit.kernel.names), so either spelling of a name finds it."""
    required(value, "policy name", max_length)
    try:
        return canonical_name(value)
    except ValueError as e:
        raise InvalidInputError(f"policy name {value!r}: {e}") from None


def request_id(value: str, max_length: int) -> str:
    """A caller's correlation id, kept in the audit record and the signed log's leaf: at most
    ``max_length`` characters, each printable (no NUL, control or lone surrogate: a store that
    rewrites one would no longer match the leaf it hashed). Empty is fine: none was given."""
    if len(value) > max_length:
        raise InvalidInputError(f"request_id is longer than {max_length} characters (limits.max_request_id_chars)")
    if not value.isprintable():
        raise InvalidInputError("request_id holds a control or unprintable character")
    return value


def environment(value: str) -> str:
    """The environment named, or the default one when none is."""
    env = value or DEFAULT_ENVIRONMENT
    if not ENVIRONMENT.fullmatch(env):
        raise InvalidInputError(
            f"invalid environment {env!r}: lowercase letters, digits, '_' and '-', starting with a letter"
        )
    return env
