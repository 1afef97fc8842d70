"""A safe, bounded YAML reader that remembers where every value came from.

PyYAML's ``SafeLoader`` already refuses python tags, but it expands aliases (billion
laughs), silently overwrites duplicate keys and forgets positions. We compose the node
graph ourselves, event by event, so that:

- anchors and aliases are refused (or bounded by ``PolicyLimits.max_aliases``);
- depth and node count are capped *while* parsing, so a hostile file fails fast;
- only the standard scalar tags are accepted;
- duplicate mapping keys are errors;
- booleans follow YAML 1.2 (only true/false), so ``name: off`` stays a string;
- each value's (line, column) is recorded under its field path for error messages.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from crossaudit.kernel.errors import PolicyIssue, PolicyValidationError
from crossaudit.kernel.limits import PolicyLimits
from crossaudit.kernel.yamlerrors import syntax_issue

Path = tuple[str | int, ...]
_SURROGATE = "a \\u escape makes a lone surrogate (not valid Unicode text)"

_ALLOWED_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
    "tag:yaml.org,2002:timestamp",
}


@dataclass
class SourceMap:
    """Positions (1-based line, column) of values and keys by field path."""

    file: str
    values: dict[Path, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path, tuple[int, int]] = field(default_factory=dict)

    def locate(self, path: Path, *, key: bool = False) -> tuple[int | None, int | None]:
        """Position of ``path``; falls back to the nearest ancestor that has one."""
        table = self.keys if key else self.values
        p = tuple(path)
        while True:
            if p in table:
                return table[p]
            if key and p in self.values:
                return self.values[p]
            if not p:
                return None, None
            p = p[:-1]

    def issue(self, path: Path, message: str, *, key: bool = False) -> PolicyIssue:
        line, col = self.locate(path, key=key)
        return PolicyIssue(message=message, path=format_path(path), file=self.file, line=line, column=col)


PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a key shown as it is in a path; any other is quoted (JSON)


def shown_key(key: object) -> str:
    """A mapping key as a path shows it: quoted unless plain, so a key holding an escape sequence,
    a dot or a newline never reaches a terminal or a log raw, nor reads as two path parts."""
    text = str(key)
    return text if PLAIN_KEY.fullmatch(text) else json.dumps(text)


def format_path(path: Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + shown_key(part)
    return out


class _Bounded(yaml.SafeLoader):
    """SafeLoader that counts nodes and depth and refuses aliases as it composes."""

    def __init__(self, stream: str, limits: PolicyLimits, file: str) -> None:
        super().__init__(stream)
        self._limits = limits
        self._file = file
        self._nodes = 0
        self._depth = 0
        self._aliases = 0

    def _fail(self, mark: Any, message: str) -> None:
        raise PolicyValidationError(
            [PolicyIssue(message=message, file=self._file, line=mark.line + 1, column=mark.column + 1)]
        )

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        event = self.peek_event()
        self._nodes += 1
        if self._nodes > self._limits.max_nodes:
            self._fail(event.start_mark, f"too many YAML nodes (limit {self._limits.max_nodes})")
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            self._aliases += 1
            if self._aliases > self._limits.max_aliases:
                self._fail(event.start_mark, "YAML anchors and aliases are not allowed in policies")
        self._depth += 1
        if self._depth > self._limits.max_depth:
            self._fail(event.start_mark, f"YAML nesting too deep (limit {self._limits.max_depth})")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(
    text: str, file: str = "<policy>", limits: PolicyLimits | None = None, *, allow_empty: bool = False
) -> tuple[Any, SourceMap]:
    """Parse ``text`` into plain Python data plus a :class:`SourceMap`; ``allow_empty``: a file
    with no document (comments only) is None rather than an error (a configuration file).

    Raises PolicyValidationError (with line:col) for syntax errors, hostile constructs and
    limit violations. Never executes anything.
    """
    limits = limits or PolicyLimits()
    if len(text.encode("utf-8", "replace")) > limits.max_file_bytes:
        raise PolicyValidationError(
            [PolicyIssue(message=f"policy file larger than {limits.max_file_bytes} bytes", file=file)]
        )
    smap = SourceMap(file=file)
    try:
        loader = _Bounded(text, limits, file)  # the reader checks every character here
    except yaml.reader.ReaderError as e:
        raise PolicyValidationError([_reader_issue(text, file, e)]) from None
    try:
        node = loader.get_single_node()
        if node is None:
            if allow_empty:
                return None, smap
            raise PolicyValidationError([PolicyIssue(message="the policy file is empty", file=file)])
        data = _to_python(node, (), smap, loader)
    except PolicyValidationError:
        raise
    except yaml.reader.ReaderError as e:
        raise PolicyValidationError([_reader_issue(text, file, e)]) from None
    except yaml.MarkedYAMLError as e:
        raise PolicyValidationError([syntax_issue(e, text, file)]) from None  # in plain words, at line:col
    except yaml.YAMLError as e:
        raise PolicyValidationError([PolicyIssue(message=f"YAML error: {e}", file=file)]) from None
    except RecursionError:
        raise PolicyValidationError([PolicyIssue(message="YAML nesting too deep", file=file)]) from None
    finally:
        loader.dispose()
    return data, smap


def _scalar(loader: Any, node: Any, path: Path, smap: SourceMap) -> Any:
    """A scalar's value; one Python cannot hold (an integer of more than 4300 digits, a date out
    of range) is a located issue, not an internal error."""
    try:
        return loader.construct_object(node, deep=True)
    except (ValueError, OverflowError) as e:
        line, col = _pos(node)
        why = "a number too long" if "digits" in str(e) else "a value that cannot be read"
        raise PolicyValidationError(
            [PolicyIssue(f"{why}: {node.value[:40]!r}", format_path(path), smap.file, line, col)]
        ) from None


def _reader_issue(text: str, file: str, e: yaml.reader.ReaderError) -> PolicyIssue:
    """A character YAML refuses (NUL, other control characters, a raw surrogate), located."""
    pos = e.position if isinstance(e.position, int) and 0 <= e.position <= len(text) else None
    char = e.character if isinstance(e.character, int) else None
    what = f"character U+{char:04X}" if char is not None else "a character"
    message = f"{what} is not allowed in a policy (only printable characters, tab and line breaks are)"
    if pos is None:
        return PolicyIssue(message=message, file=file)
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return PolicyIssue(message=message, file=file, line=line, column=column)


def _lone_surrogate(value: Any) -> bool:
    """A ``"\\ud800"`` escape decodes to a string that cannot be stored or sent (not UTF-8)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _pos(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _to_python(node: yaml.Node, path: Path, smap: SourceMap, loader: _Bounded) -> Any:
    smap.values[path] = _pos(node)
    if node.tag not in _ALLOWED_TAGS:
        line, col = _pos(node)
        raise PolicyValidationError(
            [
                PolicyIssue(
                    message=f"YAML tag {node.tag!r} is not allowed",
                    path=format_path(path),
                    file=smap.file,
                    line=line,
                    column=col,
                )
            ]
        )
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        issues: list[PolicyIssue] = []
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                line, col = _pos(key_node)
                issues.append(
                    PolicyIssue("mapping keys must be plain scalars", format_path(path), smap.file, line, col)
                )
                continue
            key = "<<" if key_node.tag == "tag:yaml.org,2002:merge" else str(_scalar(loader, key_node, path, smap))
            if _lone_surrogate(key):
                line, col = _pos(key_node)
                issues.append(PolicyIssue(_SURROGATE, format_path(path), smap.file, line, col))
                continue
            if key == "<<":
                line, col = _pos(key_node)
                issues.append(PolicyIssue("YAML merge keys are not allowed", format_path(path), smap.file, line, col))
                continue
            if key in out:
                line, col = _pos(key_node)
                first = smap.keys.get((*path, key), (None,))[0]
                also = f" (first at line {first}; a key may appear once in a mapping)" if first else ""
                issues.append(
                    PolicyIssue(f"duplicate key {key!r}{also}", format_path((*path, key)), smap.file, line, col)
                )
                continue
            smap.keys[(*path, key)] = _pos(key_node)
            out[key] = _to_python(value_node, (*path, key), smap, loader)
        if issues:
            raise PolicyValidationError(issues)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(child, (*path, i), smap, loader) for i, child in enumerate(node.value)]
    if node.tag == "tag:yaml.org,2002:bool" and node.value.lower() not in ("true", "false"):
        return node.value  # YAML 1.2: yes/no/on/off are strings (a rule may be named "off")
    value = _scalar(loader, node, path, smap)
    if _lone_surrogate(value):
        line, col = _pos(node)
        raise PolicyValidationError([PolicyIssue(_SURROGATE, format_path(path), smap.file, line, col)])
    return value
