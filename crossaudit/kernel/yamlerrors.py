"""PyYAML's syntax errors in plain words, at the line and column to fix.

PyYAML reports what its parser expected (``while parsing a block mapping … expected <block end>,
but found '<block mapping start>'``), which names parser states, not the author's mistake. The
common mistakes — a line indented unlike its neighbours, a tab, an unclosed quote or bracket, a
value with ``: `` in it, a second document — each get a sentence saying what is wrong and what to
do, located where the author must look (the start of a wrongly indented line; the opening quote
or bracket that was never closed). Any other error keeps PyYAML's own problem text.
"""

from __future__ import annotations

import re

import yaml

from crossaudit.kernel.errors import PolicyIssue

PREFIX = "YAML syntax: "
_INDENT_HINT = "(check the indentation of this line)"
_KEY_ON_LINE = re.compile(r":(\s|$)")
_FOUND = re.compile(r"but found (.+)$")
_CANNOT_START = re.compile(r"found character '(.+)' that cannot start any token")
_ESCAPE = re.compile(r"found unknown escape character '(.+)'")


# Long: one table of PyYAML's error messages, each turned into plain words in turn; split, the
# cases would lose the order they are tried in.
def syntax_issue(error: yaml.MarkedYAMLError, text: str, file: str) -> PolicyIssue:
    """One located issue for a PyYAML scanner/parser/composer error of ``text``."""
    problem = str(error.problem or "")
    context = str(error.context or "")
    mark = error.problem_mark or error.context_mark
    at = (mark.line, mark.column) if mark else None
    opened = error.context_mark
    lines = text.splitlines()

    def line_of(line: int) -> str:
        return lines[line] if 0 <= line < len(lines) else ""

    def indent_at(line: int) -> tuple[int, int]:
        """The start of the line's content: where a wrongly indented line is fixed."""
        body = line_of(line)
        return line, len(body) - len(body.lstrip(" "))

    def where(m: yaml.Mark | None) -> str:
        return f"line {m.line + 1}, column {m.column + 1}" if m else "above"

    message: str | None = None
    if problem.startswith("mapping values are not allowed") and at:
        before = line_of(at[0])[: at[1]]
        if _KEY_ON_LINE.search(before.lstrip(" -")):
            message = "a value contains ': ' (a colon and a space): put the value in quotes"
        else:
            message = f"a mapping value is not allowed here {_INDENT_HINT}"
            at = indent_at(at[0])
    elif "'\\t'" in problem or "tab character" in problem:
        message = (
            "a tab character: YAML indents and separates with spaces only (replace the tab with spaces, "
            "or put the value in quotes)"
        )
    elif problem.startswith("expected <block end>") and at:
        found = _FOUND.search(problem)
        token = found.group(1) if found else ""
        if token in ("'<block mapping start>'", "'<block sequence start>'", "'?'"):
            message = f"this line is indented differently from the lines above it {_INDENT_HINT}"
            at = indent_at(at[0])
        elif token == "'-'":
            message = f"a list item ('-') where a key was expected {_INDENT_HINT}"
            at = indent_at(at[0])
        elif token == "'<scalar>'":
            message = (
                "text follows a complete value on this line: put the whole value in quotes "
                "(inside single quotes write ' as '')"
            )
        elif token in ("']'", "'}'"):
            message = f"a closing {token} without a matching opening bracket"
        else:
            message = f"unexpected {token or 'text'} here {_INDENT_HINT}"
    elif "quoted scalar" in context and "end of stream" in problem and opened:
        quote = line_of(opened.line)[opened.column : opened.column + 1] or '"'
        message = f"the quoted value that starts here is never closed (add the closing {quote})"
        at = (opened.line, opened.column)
    elif context.startswith(("while parsing a flow sequence", "while parsing a flow mapping")) and (
        problem.startswith("expected ','")
    ):
        sequence = "sequence" in context
        opening, closing = ("[", "]") if sequence else ("{", "}")
        items = "items" if sequence else "entries"
        if "<stream end>" in problem and opened:
            message = f"the '{opening}' opened here is never closed (add '{closing}')"
            at = (opened.line, opened.column)
        else:
            message = (
                f"the '{opening}' opened at {where(opened)} is not closed before this: add '{closing}', "
                f"separate {items} with ',', and quote values that contain ': '"
            )
    elif context.startswith("while scanning a simple key") and "could not find expected ':'" in problem and opened:
        message = (
            "this line is not 'key: value' (add ':' after the key, or indent the line to continue the value above)"
        )
        at = (opened.line, opened.column)
    elif context.startswith(("while scanning an alias", "while scanning an anchor")) and opened:
        sign, what = ("*", "alias") if "alias" in context else ("&", "anchor")
        message = f"'{sign}' starts a YAML {what}, which policies do not use: put the value in quotes"
        at = (opened.line, opened.column)
    elif (start := _CANNOT_START.search(problem)) is not None:
        message = f"a value cannot start with '{start.group(1)}' in YAML: put the value in quotes"
    elif context.startswith("while scanning a directive") and opened:
        message = "'%' at the start of a line begins a YAML directive: put the key in quotes"
        at = (opened.line, opened.column)
    elif context.startswith("expected a single document"):
        message = "a policy file holds one YAML document: remove the second '---' (or what follows it)"
    elif (escape := _ESCAPE.search(problem)) is not None:
        message = (
            f"unknown escape '\\{escape.group(1)}' in a double-quoted value (write '\\\\' for a backslash, "
            "or use single quotes)"
        )
    elif context.startswith("while scanning a block scalar"):
        message = (
            "after '|' or '>' only '-', '+' or an indentation digit may follow on the line "
            "(start the text on the next line, indented)"
        )
    if message is None:  # not a common mistake: PyYAML's own words
        message = problem or context or "invalid YAML"
        if problem and context:
            message = f"{problem} ({context})"
    line, column = (at[0] + 1, at[1] + 1) if at else (None, None)
    return PolicyIssue(message=PREFIX + message, file=file, line=line, column=column)
