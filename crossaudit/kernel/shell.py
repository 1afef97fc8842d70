"""Commands printed for a user to run (a hint, "check it with: …", "run: chmod 600 …"): pasteable.

A policy named ``Offline Demo``, a path holding a space, or a tenant's name holding ``$(…)`` or a
quote is quoted as a POSIX shell reads it (:func:`shlex.quote`), so the pasted line names what
was meant, as one word, and runs nothing else. A word that needs no quoting is printed as is.
"""

from __future__ import annotations

import shlex


def command(*words: object) -> str:
    """``words`` as one shell command line, each word quoted where the shell would split or expand it."""
    return " ".join(shlex.quote(str(word)) for word in words)
