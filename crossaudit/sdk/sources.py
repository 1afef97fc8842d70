"""The policy a client sends: a file or its text, with the local code it names inlined.

The service never reads files a policy names, so ``code_file`` and ``evaluators/<name>.py``
are read here and sent as ``config.code``; issues the server finds are mapped back to lines of
the author's file.
"""

from __future__ import annotations

import os
from pathlib import Path

from crossaudit.kernel.errors import InvalidInputError
from orchestrator.policy.inline import Inlined, inline_local_code

POLICY_SUFFIXES = (".yaml", ".yml", ".json")


def policy_source(path_or_text: str | os.PathLike[str]) -> tuple[str, str]:
    """(text, filename): a path is read; a string with a newline is the policy text itself."""
    text = path_or_text if isinstance(path_or_text, str) else None
    if text is not None and ("\n" in text or not (text.endswith(POLICY_SUFFIXES) or os.sep in text)):
        return text, ""
    p = Path(path_or_text)
    try:
        return p.read_text(encoding="utf-8"), str(p)
    except FileNotFoundError:
        raise InvalidInputError(f"policy file {p} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInputError(f"cannot read policy file {p}: {e}") from None


def policy_upload(
    path_or_text: str | os.PathLike[str], base_dir: str | os.PathLike[str] | None
) -> tuple[str, str, Inlined]:
    """(text to send, filename, how it was inlined). Local files are relative to the policy
    file, or for policy text to ``base_dir`` (without one, text is sent as is and the service
    refuses a ``code_file``). A file it names that cannot be read is a PolicyValidationError."""
    text, filename = policy_source(path_or_text)
    base = Path(filename).parent if filename else base_dir
    if base is None:
        return text, filename, Inlined(text)
    inlined = inline_local_code(text, base, filename=filename or "<policy>")
    return inlined.text, filename, inlined
