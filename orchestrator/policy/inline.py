"""Inline the local files a policy names, before it leaves the author's machine.

The service never reads a file that a policy names (a tenant could otherwise run, or probe,
any file of the server). ``crossaudit policy deploy``, ``Client.deploy_policy`` and the
operator's ``--policies-dir`` bootstrap therefore put those files into the policy text:

- ``config.code_file`` (relative to the policy file, or absolute) becomes ``config.code``;
- a custom evaluator without ``id``, ``code`` or ``code_file`` whose ``evaluators/<name>.py``
  exists next to the policy file gets it as ``config.code``.

Precedence is the PolicyTester's: ``id`` > ``code`` > ``code_file`` > ``evaluators/<name>.py``
> an uploaded evaluator of the same name (the local file wins over an upload: the author sees
it). The edit is textual, so comments and layout survive: the reference is replaced by
``code: "<the source as one double-quoted YAML string>"`` on the same line, and a missing
``code`` key is added as one new line (:meth:`Inlined.original_line` maps lines back for
error messages). The result is parsed again and compared before it is used.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from crossaudit.kernel.dsl import BUILTIN_MODELS, NAME_PATTERN
from crossaudit.kernel.errors import PolicyIssue, PolicyValidationError
from crossaudit.kernel.limits import PolicyLimits
from crossaudit.kernel.yamlsafe import SourceMap, load_yaml

LOCAL_EVALUATOR_DIR = "evaluators"  # <policy dir>/evaluators/<name>.py serves custom evaluators by name
_NAME = re.compile(NAME_PATTERN)
# What a YAML double-quoted scalar must escape besides what JSON escapes: characters PyYAML's
# reader refuses raw (C0/C1 controls, DEL, surrogates, U+FFFE/U+FFFF) and the line breaks YAML
# folds to spaces inside a quoted scalar (NEL, U+2028, U+2029).
_YAML_UNPRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass(frozen=True)
class Inlined:
    text: str
    files: tuple[str, ...] = ()  # the files that were inlined, as the policy named them
    inserted_lines: tuple[int, ...] = field(default=())  # 1-based lines of ``text`` that were added

    def original_line(self, line: int | None) -> int | None:
        """The line of the author's file that ``line`` of the inlined text comes from."""
        if line is None:
            return None
        return line - sum(1 for n in self.inserted_lines if n < line)

    def relocate(self, error: PolicyValidationError, filename: str = "") -> PolicyValidationError:
        """``error`` (from validating :attr:`text`) with lines of the author's file."""
        if not self.inserted_lines:
            return error
        issues = [
            PolicyIssue(i.message, i.path, i.file or filename, self.original_line(i.line), i.column)
            for i in error.issues
        ]
        return PolicyValidationError(issues)


def yaml_quote(text: str) -> str:
    """``text`` as one double-quoted YAML scalar (JSON escapes, plus what YAML needs escaped)."""
    quoted = json.dumps(text, ensure_ascii=False)

    def esc(m: re.Match[str]) -> str:
        c = ord(m.group(0))
        return f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}"

    return _YAML_UNPRINTABLE.sub(esc, quoted)


def _is_custom(raw: dict[str, Any]) -> bool:
    declared = raw.get("type")
    if isinstance(declared, str):
        return declared.strip().lower() == "custom"
    config = raw.get("config")
    cfg: dict[str, Any] = config if isinstance(config, dict) else {}
    if "provider" in cfg or cfg.get("model") in BUILTIN_MODELS:
        return False
    return bool({"code", "code_file", "dependencies"} & set(cfg))


def _read(path: Path, limits: PolicyLimits) -> str:
    with open(path, "rb") as fh:
        raw = fh.read(limits.max_file_bytes + 1)
    if len(raw) > limits.max_file_bytes:
        raise ValueError(f"larger than {limits.max_file_bytes} bytes")
    return raw.decode("utf-8")


@dataclass
class _Edit:
    start: int  # character offsets into the original text
    end: int
    replacement: str
    adds_line_before: int | None = None  # 1-based original line a new line is inserted before


def inline_local_code(
    text: str, base_dir: str | os.PathLike[str], *, filename: str = "<policy>", limits: PolicyLimits | None = None
) -> Inlined:
    """``text`` with ``code_file`` and ``evaluators/<name>.py`` (resolved from ``base_dir``)
    inlined as ``config.code``. A policy that does not parse is returned as is (the validator
    reports it); a named file that cannot be read is a PolicyValidationError at its field."""
    limits = limits or PolicyLimits()
    try:
        data, smap = load_yaml(text, filename, limits)
    except PolicyValidationError:
        return Inlined(text)
    evaluators = data.get("evaluators") if isinstance(data, dict) else None
    if not isinstance(evaluators, list):
        return Inlined(text)
    root = yaml.compose(text, Loader=yaml.SafeLoader)  # bounds already checked by load_yaml
    nodes = _evaluator_nodes(root)
    base = Path(base_dir)
    edits: list[_Edit] = []
    files: list[str] = []
    expected = [dict(e) if isinstance(e, dict) else e for e in evaluators]
    issues: list[PolicyIssue] = []
    for i, raw in enumerate(evaluators):
        if not isinstance(raw, dict) or raw.get("id") or i >= len(nodes) or not _is_custom(raw):
            continue
        cfg = raw.get("config")
        if cfg is not None and not isinstance(cfg, dict):
            continue
        cfg = cfg or {}
        if "code" in cfg:
            continue
        node = nodes[i]
        if "code_file" in cfg:
            ref = cfg["code_file"]
            if not isinstance(ref, str) or not ref.strip():
                continue  # the validator reports it
            code = _read_or_issue(base / ref, ("evaluators", i, "config", "code_file"), smap, limits, issues)
            if code is None:
                continue
            key, value = _entry(_entry(node, "config")[1], "code_file")
            edits.append(_replace_entry(text, key, value, "code: " + yaml_quote(code)))
            new_cfg = {k: v for k, v in cfg.items() if k != "code_file"}
            new_cfg["code"] = code
            files.append(ref)
        else:
            name = raw.get("name")
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                continue
            local = base / LOCAL_EVALUATOR_DIR / f"{name}.py"
            if not local.is_file():
                continue
            code = _read_or_issue(local, ("evaluators", i), smap, limits, issues)
            if code is None:
                continue
            edits.append(_add_code(text, node, code))
            new_cfg = {**cfg, "code": code}
            files.append(f"{LOCAL_EVALUATOR_DIR}/{name}.py")
        expected[i] = {**raw, "config": new_cfg}
    if issues:
        raise PolicyValidationError(issues)
    if not edits:
        return Inlined(text)
    out = text
    for e in sorted(edits, key=lambda e: e.start, reverse=True):
        out = out[: e.start] + e.replacement + out[e.end :]
    added = sorted(e.adds_line_before for e in edits if e.adds_line_before is not None)
    inserted = tuple(line + k for k, line in enumerate(added))
    check, _ = load_yaml(out, filename, limits)
    if check != {**data, "evaluators": expected}:  # pragma: no cover - a layout this editor misreads
        raise PolicyValidationError(
            [PolicyIssue(f"could not inline {', '.join(files)}: put the code in config.code", "evaluators", filename)]
        )
    return Inlined(out, tuple(files), inserted)


def _read_or_issue(
    path: Path, where: tuple[str | int, ...], smap: SourceMap, limits: PolicyLimits, issues: list[PolicyIssue]
) -> str | None:
    try:
        return _read(path, limits)
    except FileNotFoundError:
        issues.append(smap.issue(where, f"cannot inline {path}: file not found"))
    except OSError as e:
        issues.append(smap.issue(where, f"cannot inline {path}: {e.strerror}"))
    except (ValueError, UnicodeDecodeError) as e:
        issues.append(smap.issue(where, f"cannot inline {path}: {e}"))
    return None


def _evaluator_nodes(root: yaml.Node | None) -> list[yaml.Node]:
    if isinstance(root, yaml.MappingNode):
        for k, v in root.value:
            if isinstance(k, yaml.ScalarNode) and k.value == "evaluators" and isinstance(v, yaml.SequenceNode):
                return list(v.value)
    return []


def _entry(node: yaml.Node | None, key: str) -> tuple[yaml.Node | None, yaml.Node | None]:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                return k, v
    return None, None


def _replace_entry(text: str, key: yaml.Node | None, value: yaml.Node | None, replacement: str) -> _Edit:
    """``key: value`` → ``replacement``, keeping the line count (a block scalar's lines become blank)."""
    assert key is not None and value is not None
    start, end = key.start_mark.index, value.end_mark.index
    return _Edit(start, end, replacement + "\n" * text[start:end].count("\n"))


def _add_code(text: str, evaluator: yaml.Node, code: str) -> _Edit:
    """Add ``code`` to the evaluator's config mapping, creating ``config`` when there is none."""
    key, cfg = _entry(evaluator, "config")
    if isinstance(cfg, yaml.MappingNode):
        return _prepend(cfg, "code: " + yaml_quote(code))
    entry = "config: {code: " + yaml_quote(code) + "}"
    if key is not None and cfg is not None:  # config: (null)
        return _replace_entry(text, key, cfg, entry)
    assert isinstance(evaluator, yaml.MappingNode)
    return _prepend(evaluator, entry)


def _prepend(mapping: yaml.MappingNode, entry: str) -> _Edit:
    """Insert ``entry`` as the mapping's first key: inside ``{`` for a flow mapping (same line),
    else on a new line before the first key, at its column."""
    if mapping.flow_style or not mapping.value:
        at = mapping.start_mark.index + 1  # just after "{"
        return _Edit(at, at, entry + (", " if mapping.value else ""))
    first = mapping.value[0][0]
    at = first.start_mark.index
    return _Edit(at, at, entry + "\n" + " " * first.start_mark.column, adds_line_before=first.start_mark.line + 1)
