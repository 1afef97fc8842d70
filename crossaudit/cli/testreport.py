"""What ``crossaudit policy test`` reports, apart from running: which files a path means, the
per-policy suites, and their JSON and JUnit XML forms. Pure (files in, text out), so unit-tested.

* A directory means every ``*.yaml`` / ``*.yml`` under it, recursively, in sorted order; hidden
  directories (``.git``, ``.venv``) and symlinked directories are not entered. A policy found in
  a directory without test cases is skipped; a file named on the command line without any is an
  error (it was asked for).
* JUnit XML: one ``testsuite`` per policy file, one ``testcase`` per case, ``failure`` for a wrong
  decision and ``error`` for a case whose rules got no verdict (or a policy that cannot load),
  the rule-by-rule explanation as their text, ``skipped`` for a policy skipped. Text that XML
  1.0 cannot carry is replaced. Its counts are the console's total line and the JSON summary:
  tests = passed + failed + errors + skipped.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from crossaudit.evals.cassettes import RepeatReport
from crossaudit.kernel.errors import InvalidInputError
from crossaudit.sdk.cases import CaseResult, CaseStatus, RuleRow, Tally

POLICY_FILE_SUFFIXES = (".yaml", ".yml")
MAX_POLICY_FILES = 10_000  # files one run may discover: a mistyped root directory fails fast
JUNIT_SUITES_NAME = "crossaudit policy test"
_XML_INVALID = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass(frozen=True)
class PolicyFile:
    path: Path
    explicit: bool  # named on the command line (not found in a directory)


def discover(paths: list[str]) -> list[PolicyFile]:
    """The policy files ``paths`` mean (see the module docstring), each once, in order."""
    out: list[PolicyFile] = []
    seen: set[Path] = set()

    def add(path: Path, explicit: bool) -> None:
        key = path.resolve()
        if key in seen:
            return
        seen.add(key)
        if len(out) >= MAX_POLICY_FILES:
            raise InvalidInputError(f"more than {MAX_POLICY_FILES} policy files: name a narrower directory")
        out.append(PolicyFile(path, explicit))

    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = []
            for root, dirs, files in os.walk(p, followlinks=False):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [Path(root) / f for f in files if f.endswith(POLICY_FILE_SUFFIXES) and not f.startswith(".")]
                if len(found) > MAX_POLICY_FILES:
                    raise InvalidInputError(f"{raw}: more than {MAX_POLICY_FILES} policy files")
            for f in sorted(found):
                add(f, False)
        elif p.is_file():
            add(p, True)
        else:
            raise InvalidInputError(f"{raw}: no such file or directory")
    return out


@dataclass
class Suite:
    """One policy file's run: its cases, or why it could not run."""

    file: str
    policy: str = ""  # the policy's name (empty when it could not load)
    cases: list[CaseResult] = field(default_factory=list)
    error: str | None = None  # the file could not be loaded or run at all
    skipped: str | None = None  # why it was not run (no test cases, found in a directory)
    warnings: list[str] = field(default_factory=list)  # local results may differ, unprepared evaluators
    where: str = ""  # "local (docker sandbox)" or "server 127.0.0.1:50051 (production)"
    duration_s: float = 0.0
    repeat: RepeatReport | None = None  # --repeat N: pass rates, pass^N and flaky rules over the N runs

    def tally(self) -> Tally:
        t = Tally()
        for c in self.cases:
            t.add(c.status or CaseStatus.FAIL)
        return t

    @property
    def ok(self) -> bool:
        return self.error is None and self.tally().ok

    def as_dict(self) -> dict[str, Any]:
        t = self.tally()
        return {
            "file": self.file,
            "policy": self.policy,
            "where": self.where,
            "ok": self.ok,
            "error": self.error,
            "skipped": self.skipped,
            "warnings": list(self.warnings),
            "passed": t.passed,
            "failed": t.failed,
            "errors": t.errors + (self.error is not None),
            "duration_s": round(self.duration_s, 6),
            "cases": [c.as_dict() for c in self.cases],
            **({"repeat": self.repeat.as_dict()} if self.repeat is not None else {}),
        }


def overall(suites: list[Suite]) -> Tally:
    total = Tally()
    for s in suites:
        t = s.tally()
        total.passed += t.passed
        total.failed += t.failed
        total.errors += t.errors + (s.error is not None)
    return total


def skipped_count(suites: list[Suite]) -> int:
    """Policies found in a directory without test cases: one skipped test each, in every report."""
    return sum(s.skipped is not None for s in suites)


def total_line(suites: list[Suite]) -> str:
    """The console's total, in JUnit's counts: its ``tests`` is passed + failed + errors + skipped."""
    skipped = skipped_count(suites)
    line = f"total: {len(suites)} policies, {overall(suites).line()}"
    return line + (f", {skipped} skipped (no test cases)" if skipped else "")


def run_ok(suites: list[Suite]) -> bool:
    """Every suite ran and passed, and at least one case ran."""
    return all(s.ok for s in suites) and overall(suites).total > 0


def json_report(suites: list[Suite], *, where: str) -> dict[str, Any]:
    t = overall(suites)
    return {
        "ok": run_ok(suites),
        "where": where,
        "summary": {
            "policies": len(suites),
            "skipped_policies": skipped_count(suites),
            "cases": sum(len(s.cases) for s in suites),
            "tests": t.total + skipped_count(suites),  # as JUnit counts: every outcome below
            "passed": t.passed,
            "failed": t.failed,
            "errors": t.errors,
            "skipped": skipped_count(suites),
        },
        "suites": [s.as_dict() for s in suites],
    }


def explain_text(rows: list[RuleRow]) -> str:
    """The rule-by-rule explanation as plain text (JUnit bodies, logs)."""
    lines = []
    for r in rows:
        score = "-" if r.score is None else str(round(r.score, 6))
        threshold = "-" if r.threshold is None else str(round(r.threshold, 6))
        lines.append(f"rule {r.rule}: {r.status}, score {score}, threshold {threshold}, action {r.action or '-'}")
        if r.reason:
            lines.append(f"  reason: {r.reason}")
        lines += [f"  evaluator error: {e}".replace("\n", "\n    ") for e in r.errors]
    return "\n".join(lines)


def case_explanation(case: CaseResult) -> str:
    """The case's line (its error names any local-vs-server note), then every rule."""
    return "\n".join(x for x in (case.line(), explain_text(case.rows())) if x)


def _x(text: str) -> str:
    return _XML_INVALID.sub("\ufffd", text)


def _num(value: float) -> str:
    return f"{value:.6f}"


def _junit_tests(s: Suite) -> int:
    """The suite's testcase elements: its cases, plus one for a load error and one for a skip."""
    return len(s.cases) + (s.error is not None) + (s.skipped is not None)


def junit_xml(suites: list[Suite], *, now: datetime | None = None) -> bytes:
    """JUnit XML of the run (see the module docstring), UTF-8 with a declaration."""
    stamp = (now or datetime.now(UTC)).replace(microsecond=0).isoformat()
    t = overall(suites)
    root = ET.Element(
        "testsuites",
        name=JUNIT_SUITES_NAME,
        tests=str(sum(_junit_tests(s) for s in suites)),
        failures=str(t.failed),
        errors=str(t.errors),
        skipped=str(skipped_count(suites)),
        time=_num(sum(s.duration_s for s in suites)),
    )
    for s in suites:
        st = s.tally()
        name = s.policy or s.file
        suite = ET.SubElement(
            root,
            "testsuite",
            name=_x(name),
            tests=str(_junit_tests(s)),
            failures=str(st.failed),
            errors=str(st.errors + (s.error is not None)),
            skipped="1" if s.skipped is not None else "0",
            time=_num(s.duration_s),
            timestamp=stamp,
            file=_x(s.file),
        )
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="file", value=_x(s.file))
        if s.where:
            ET.SubElement(props, "property", name="where", value=_x(s.where))
        for w in s.warnings:
            ET.SubElement(props, "property", name="warning", value=_x(w))
        if s.error is not None:
            tc = ET.SubElement(suite, "testcase", name="(load policy)", classname=_x(name), file=_x(s.file), time="0")
            err = ET.SubElement(tc, "error", message=_x(s.error.splitlines()[0] if s.error else ""), type="PolicyError")
            err.text = _x(s.error)
        if s.skipped is not None:
            tc = ET.SubElement(suite, "testcase", name="(no test cases)", classname=_x(name), file=_x(s.file), time="0")
            ET.SubElement(tc, "skipped", message=_x(s.skipped))
        for c in s.cases:
            tc = ET.SubElement(
                suite, "testcase", name=_x(c.name), classname=_x(name), file=_x(s.file), time=_num(c.duration_s)
            )
            if c.status is CaseStatus.PASS:
                continue
            tag, kind = ("failure", "WrongDecision") if c.status is CaseStatus.FAIL else ("error", "RuleError")
            if c.status is CaseStatus.ERROR and c.decision is None:
                kind = "EvaluationError"
            el = ET.SubElement(tc, tag, message=_x(f"expected {c.expected}, got {c.actual}"), type=kind)
            el.text = _x(case_explanation(c))
        if s.warnings:
            ET.SubElement(suite, "system-err").text = _x("\n".join(f"warning: {w}" for w in s.warnings))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
