"""Names people tell apart by eye (policy names): one canonical spelling, nothing invisible.

Two spellings of "Café" (a precomposed "é", or "e" + COMBINING ACUTE ACCENT) look alike and
compare different; a right-to-left override makes "payroll" display as another word; a zero-width
or no-break space hides inside a name. A tenant could so deploy a second policy that a reviewer
or an operator takes for the first. A name is therefore put in Unicode NFC where it enters, once:
the DSL model for what is stored (``Policy.name``), the service's input checks for what callers
look up (``crossaudit.service.inputs.policy_name``); the store compares canonical names exactly.
A name holding a bidirectional control, a zero-width or other invisible formatting character, a
control character, a space other than U+0020, or whitespace at either end is refused, naming
the character and where it is, never guessing what was meant.

NFC does not fold compatibility forms ("ﬁ", full-width letters) or confusable scripts (a Cyrillic
"а" for a Latin "a"): see docs/threat-model.md.
"""

from __future__ import annotations

import unicodedata

# Explicit directional formatting characters (UAX #9): embeddings, overrides, isolates, marks.
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
# Zero-width characters: space, non-joiner, joiner, word joiner, zero-width no-break space (BOM).
ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff")
# Other categories no name needs: controls, other formatting characters (soft hyphen, invisible
# operators, tags), surrogates, private use, line and paragraph separators.
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})


def _describe(c: str) -> str:
    return f"U+{ord(c):04X} {unicodedata.name(c, 'UNNAMED')}"


def name_problem(value: str) -> str | None:
    """Why ``value`` (already NFC) cannot be a name, locating the character; None when it can."""
    for i, c in enumerate(value, start=1):
        if c in BIDI_CONTROLS:
            kind = "a bidirectional control (it makes a name display as another)"
        elif c in ZERO_WIDTH:
            kind = "a zero-width character (invisible)"
        elif unicodedata.category(c) in REFUSED_CATEGORIES:
            kind = "an invisible or control character"
        elif c != " " and unicodedata.category(c) == "Zs":
            kind = "a space other than U+0020 SPACE (it looks like one)"
        else:
            continue
        return f"character {i} is {_describe(c)}, {kind}: names may not hold it"
    if value != value.strip():
        return "starts or ends with whitespace (it would look like the name without it)"
    return None


def canonical_name(value: str) -> str:
    """``value`` in NFC; ValueError saying which character makes it unusable as a name."""
    canonical = unicodedata.normalize("NFC", value)
    problem = name_problem(canonical)
    if problem is not None:
        raise ValueError(problem)
    return canonical
