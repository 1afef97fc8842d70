"""What ``crossaudit eval`` reports: per rule and for the decision, measured on labelled rows.

:func:`build_report` turns an :class:`~crossaudit.evals.runner.EvalRun` into an
:class:`EvalReport` (confusion matrices, metrics with intervals, latency, LLM cost, sweeps and
suggested thresholds, wrong rows); :func:`compare` two runs of the same rows into a
:class:`Comparison` with McNemar's test per rule; :class:`Gate` is one ``--fail-under``.
Renderings: ``to_json`` (``--json``), :func:`html_report` (``--html``: self-contained, images as
``data:`` URIs, every value escaped), :func:`cases_yaml` (wrong rows as ``test_cases``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from crossaudit.evals.dataset import Row
from crossaudit.evals.metrics import (
    BOOTSTRAP_RESAMPLES,
    CONFIDENCE,
    METRICS,
    Confusion,
    McNemar,
    Metric,
    mcnemar,
    metrics_with_ci,
    percentile,
)
from crossaudit.evals.runner import EvalRun, RowOutcome, numeric_threshold, rule_names
from crossaudit.evals.sweep import Suggestion, Sweep, Target, plot_curves, suggest, sweep
from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.htmlreport import escape, page, png_img

DECISION = "decision"  # the subject name of the decision-level measures (not a rule name: rules may not use it)
MAX_WRONG_ROWS = 1000  # wrong rows kept per subject (the count of all is kept)
_GATE = re.compile(r"^(?P<subject>[^=]+)=(?P<metric>[a-z0-9]+):(?P<value>[0-9]*\.?[0-9]+)$")


@dataclass(frozen=True)
class WrongRow:
    row: Row
    expected: str  # pass | fail (the rule's or the decision's), or an action
    got: str
    score: float | None = None
    threshold: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.row.id,
            "line": self.row.line,
            "expected": self.expected,
            "got": self.got,
            "score": self.score,
            "threshold": self.threshold,
        }


@dataclass
class Subject:
    """The measures of one rule, or of the decision (``name == DECISION``)."""

    name: str
    labelled: int  # rows with a label for it
    unjudged: int  # labelled rows that got no verdict (an evaluator error, a timeout, no score)
    confusion: Confusion
    metrics: dict[str, Metric]
    latency_p50_ms: float | None = None  # over the rows evaluated alone: one call's own cost
    latency_p95_ms: float | None = None
    loaded_p50_ms: float | None = None  # over the rows evaluated together: queueing included
    loaded_p95_ms: float | None = None
    cost_usd: float | None = None
    sweep: Sweep | None = None
    suggestion: Suggestion | None = None
    wrong: list[WrongRow] = field(default_factory=list)
    wrong_count: int = 0
    action_labelled: int = 0  # decision only: rows with an expected action
    action_right: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "labelled": self.labelled,
            "unjudged": self.unjudged,
            "confusion": self.confusion.to_json(),
            "metrics": {k: m.to_json() for k, m in self.metrics.items()},
            "wrong": [w.to_json() for w in self.wrong],
            "wrong_count": self.wrong_count,
        }
        if self.name == DECISION:
            out["action"] = {"labelled": self.action_labelled, "right": self.action_right}
        else:
            out["latency_ms"] = {"p50": self.latency_p50_ms, "p95": self.latency_p95_ms}
            if self.loaded_p50_ms is not None:
                out["latency_under_load_ms"] = {"p50": self.loaded_p50_ms, "p95": self.loaded_p95_ms}
            out["llm_cost_usd"] = self.cost_usd
        if self.sweep is not None:
            out["sweep"] = self.sweep.to_json()
        if self.suggestion is not None:
            out["suggested_threshold"] = self.suggestion.to_json()
        return out


@dataclass
class EvalReport:
    policy: str
    version: str
    rows: int
    where: str
    wall_s: float
    seed: int
    errors: list[tuple[str, str]]  # (row id, why the request could not be evaluated)
    subjects: dict[str, Subject]  # DECISION first, then the rules in policy order
    notes: list[str] = field(default_factory=list)
    target: Target | None = None
    source: str = ""  # the policy file as given (two versions often share a name and a version)
    latency_rows: int = 0  # rows evaluated alone, whose latency the per-rule p50/p95 are
    in_flight: int = 1  # rows evaluated together after them (--concurrency)
    loaded_rows: int = 0

    @property
    def latency_text(self) -> str:
        """What the latency figures are: a p50 over rows that queued behind each other is the wait
        plus the work, not what a call costs."""
        if not self.latency_rows:
            return "latency: no row was evaluated (no rule latency)"
        text = (
            f"latency: p50/p95 per rule over {self.latency_rows} row(s) evaluated one at a time, "
            "what one call costs on an idle engine"
        )
        if self.loaded_rows:
            text += (
                f"; the other {self.loaded_rows} ran {self.in_flight} at a time for throughput, their latency "
                "(waiting for sandboxes, model servers and cores included) is latency_under_load_ms in --json"
            )
        return text

    @property
    def label(self) -> str:
        """How a comparison names this side: its file first, then the policy's name and version."""
        named = f"{self.policy} {self.version}"
        return f"{self.source} ({named})" if self.source else named

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "version": self.version,
            "rows": self.rows,
            "where": self.where,
            "seconds": round(self.wall_s, 3),
            "rows_per_second": round(self.rows_per_s, 1),
            "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "confidence": CONFIDENCE, "seed": self.seed},
            "latency": {"alone_rows": self.latency_rows, "loaded_rows": self.loaded_rows, "in_flight": self.in_flight},
            "target": str(self.target) if self.target else None,
            "errors": [{"id": i, "error": e} for i, e in self.errors],
            "notes": self.notes,
            "decision": self.subjects[DECISION].to_json(),
            "rules": {k: s.to_json() for k, s in self.subjects.items() if k != DECISION},
            "test_cases": cases_of(self),
        }


# --- building -----------------------------------------------------------------------------------


def _verdict(o: RowOutcome, subject: str) -> tuple[bool | None, float | None, float | None]:
    """(predicted violation or None when there is no verdict, score, threshold)."""
    if subject == DECISION:
        return (None if o.passed is None else not o.passed), None, None
    r = o.rules.get(subject)
    if r is None or r.passed is None:
        return None, None if r is None else r.score, None if r is None else r.threshold
    return (not r.passed), r.score, r.threshold


def _label(row: Row, subject: str) -> bool | None:
    """Labelled violation (True), labelled fine (False), or not labelled (None)."""
    if subject == DECISION:
        return None if row.passed is None else not row.passed
    v = row.rules.get(subject)
    return None if v is None else not v


def _subject(run: EvalRun, name: str, seed: int, target: Target | None) -> Subject:
    expected: list[bool] = []
    predicted: list[bool] = []
    scored: list[tuple[float, bool]] = []
    wrong: list[WrongRow] = []
    wrong_count = unjudged = labelled = 0
    for o in run.outcomes:
        label = _label(o.row, name)
        if label is None:
            continue
        labelled += 1
        pred, score, threshold = _verdict(o, name)
        if pred is None:
            unjudged += 1
            continue
        expected.append(label)
        predicted.append(pred)
        if score is not None and name != DECISION:
            scored.append((score, label))
        if pred != label:
            wrong_count += 1
            if len(wrong) < MAX_WRONG_ROWS:
                wrong.append(WrongRow(o.row, _pf(label), _pf(pred), score, threshold))
    confusion, metrics = metrics_with_ci(expected, predicted, seed=seed)
    s = Subject(name, labelled, unjudged, confusion, metrics, wrong=wrong, wrong_count=wrong_count)
    if name == DECISION:
        _actions(run, s)
        return s
    for alone in (True, False):
        latencies = [
            o.rules[name].latency_ms
            for o in run.outcomes
            if name in o.rules and not o.threshold_only and o.alone is alone and o.rules[name].latency_ms > 0
        ]
        p50, p95 = percentile(latencies, 0.5), percentile(latencies, 0.95)
        if alone:
            s.latency_p50_ms, s.latency_p95_ms = p50, p95
        else:
            s.loaded_p50_ms, s.loaded_p95_ms = p50, p95
    s.cost_usd = run.rule_cost(name)
    current = numeric_threshold(run.policy, name)
    if scored and current is not None:
        s.sweep = sweep(name, current, [x for x, _ in scored], [v for _, v in scored])
        if target is not None:
            s.suggestion = suggest(s.sweep, target)
    return s


def _pf(violation: bool) -> str:
    return "fail" if violation else "pass"


def _actions(run: EvalRun, s: Subject) -> None:
    """The decision's action against rows labelled with one; a wrong action lists its row once."""
    listed = {id(w.row) for w in s.wrong}
    for o in run.outcomes:
        if o.row.action is None or o.action is None:
            continue
        s.action_labelled += 1
        if o.action == o.row.action:
            s.action_right += 1
        elif id(o.row) not in listed and len(s.wrong) < MAX_WRONG_ROWS:
            s.wrong.append(WrongRow(o.row, f"action {o.row.action}", f"action {o.action}"))
            listed.add(id(o.row))


def build_report(run: EvalRun, *, seed: int = 0, target: Target | None = None) -> EvalReport:
    names = rule_names(run.policy)
    subjects = {DECISION: _subject(run, DECISION, seed, target)}
    for name in names:
        subjects[name] = _subject(run, name, seed, target)
    errors = [(o.row.id, o.error) for o in run.outcomes if o.error]
    notes = list(run.notes)
    for name, s in subjects.items():
        if s.labelled == 0 and name != DECISION:
            notes.append(f"rule {name!r} has no label in the dataset: not measured")
        elif s.labelled and s.confusion.tp + s.confusion.fn == 0:
            notes.append(f"{name}: no labelled violation, so recall and F1 are undefined (not 0)")
    if any(o.threshold_only for o in run.outcomes):
        n = sum(o.threshold_only for o in run.outcomes)
        notes.append(f"{n} row(s) without text judged threshold-only from their recorded scores")
    return EvalReport(
        policy=run.policy.name,
        version=run.policy.version,
        rows=len(run.outcomes),
        where=run.where,
        wall_s=run.wall_s,
        seed=seed,
        errors=errors,
        subjects=subjects,
        notes=notes,
        target=target,
        source=run.source,
        latency_rows=sum(o.alone and not o.threshold_only and not o.error for o in run.outcomes),
        in_flight=run.concurrency,
        loaded_rows=sum(not o.alone and not o.threshold_only and not o.error for o in run.outcomes),
    )


# --- gates --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gate:
    """``--fail-under rule=metric:value``: the run fails unless the metric is defined and >= value."""

    subject: str
    metric: str
    bound: float

    @classmethod
    def parse(cls, text: str, subjects: Sequence[str]) -> Gate:
        m = _GATE.match(text.strip())
        if not m:
            raise InvalidInputError(f"--fail-under {text!r}: give RULE=METRIC:VALUE, e.g. toxicity=precision:0.9")
        subject, metric, value = m.group("subject").strip(), m.group("metric"), float(m.group("value"))
        if metric not in METRICS:
            raise InvalidInputError(f"--fail-under {text!r}: metric {metric!r} is not one of {', '.join(METRICS)}")
        if not 0 <= value <= 1:
            raise InvalidInputError(f"--fail-under {text!r}: the value must be in [0, 1]")
        if subject not in subjects:
            raise InvalidInputError(
                f"--fail-under {text!r}: {subject!r} is not a rule of the policy (rules: "
                f"{', '.join(s for s in subjects if s != DECISION)}; or {DECISION})"
            )
        return cls(subject, metric, value)

    def failure(self, report: EvalReport) -> str | None:
        """Why the gate fails on ``report``, or None when it holds."""
        m = report.subjects[self.subject].metrics[self.metric]
        if m.value is None:
            return f"{self.subject} {self.metric} is undefined ({m.reason}), needed >= {self.bound:g}"
        if m.value < self.bound:
            return f"{self.subject} {self.metric} {m.value:.3f} < {self.bound:g}"
        return None


# --- wrong rows as test cases -------------------------------------------------------------------


def _case(row: Row, expected: str, action: str | None, why: str) -> dict[str, Any]:
    case: dict[str, Any] = {
        "name": f"eval_{re.sub(r'[^A-Za-z0-9_]', '_', row.id)}",
        "description": why,
        "input": {"prompt": row.prompt or "", "response": row.response or ""},
        "expected_result": expected,
    }
    if row.context:
        case["input"]["context"] = row.context
    if row.stage:
        case["input"]["stage"] = row.stage
    if action:
        case["expected_action"] = action
    return case


def cases_of(report: EvalReport) -> list[dict[str, Any]]:
    """The rows something got wrong, as ``test_cases`` entries (one per row; rows without text left out).

    A row labelled at the decision level keeps its labels (``passed``, ``action``); a row
    labelled per rule only becomes a case where its labels determine the decision: a rule that
    should fail → ``fail``; every labelled rule should pass → ``pass``."""
    out: dict[str, dict[str, Any]] = {}
    for name, s in report.subjects.items():
        for w in s.wrong:
            row = w.row
            if row.response is None or row.id in out:
                continue
            why = f"{name}: expected {w.expected}, got {w.got}"
            if row.passed is not None:
                out[row.id] = _case(row, "pass" if row.passed else "fail", row.action, why)
            elif row.action is not None:
                out[row.id] = _case(row, "pass" if row.action == "allow" else "fail", row.action, why)
            elif any(not v for v in row.rules.values()):
                out[row.id] = _case(row, "fail", None, why)
            elif row.rules:
                out[row.id] = _case(row, "pass", None, why)
    return list(out.values())


def cases_yaml(report: EvalReport) -> str:
    cases = cases_of(report)
    if not cases:
        return ""
    return yaml.safe_dump({"test_cases": cases}, sort_keys=False, allow_unicode=True, width=120)


# --- comparing two policies on the same rows ----------------------------------------------------


@dataclass(frozen=True)
class Delta:
    subject: str
    a: dict[str, Metric]
    b: dict[str, Metric]
    test: McNemar
    paired: int  # rows both judged and labelled

    def delta(self, metric: str) -> float | None:
        x, y = self.a[metric].value, self.b[metric].value
        return None if x is None or y is None else y - x

    def verdict(self) -> str:
        if self.test.b == self.test.c or not self.test.significant:
            return "no significant difference"
        return "B better" if self.test.c > self.test.b else "A better"

    def to_json(self) -> dict[str, Any]:
        return {
            "paired_rows": self.paired,
            "a": {k: m.to_json() for k, m in self.a.items()},
            "b": {k: m.to_json() for k, m in self.b.items()},
            "delta": {k: self.delta(k) for k in METRICS},
            "mcnemar": self.test.to_json(),
            "verdict": self.verdict(),
        }


@dataclass
class Comparison:
    a: EvalReport
    b: EvalReport
    deltas: list[Delta]
    only_a: list[str]
    only_b: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "a": {"policy": self.a.policy, "version": self.a.version, "file": self.a.source},
            "b": {"policy": self.b.policy, "version": self.b.version, "file": self.b.source},
            "rows": self.a.rows,
            "subjects": {d.subject: d.to_json() for d in self.deltas},
            "rules_only_in_a": self.only_a,
            "rules_only_in_b": self.only_b,
        }


def compare(run_a: EvalRun, run_b: EvalRun, *, seed: int = 0) -> Comparison:
    """Both runs over the same rows: per subject in both, metrics side by side and McNemar on the
    rows both judged (a row's correctness: its verdict equals its label)."""
    ra, rb = build_report(run_a, seed=seed), build_report(run_b, seed=seed)
    names_a, names_b = rule_names(run_a.policy), rule_names(run_b.policy)
    deltas = []
    for name in [DECISION, *[n for n in names_a if n in names_b]]:
        a_right, b_right = [], []
        for oa, ob in zip(run_a.outcomes, run_b.outcomes, strict=True):
            label = _label(oa.row, name)
            pa, pb = _verdict(oa, name)[0], _verdict(ob, name)[0]
            if label is None or pa is None or pb is None:
                continue
            a_right.append(pa == label)
            b_right.append(pb == label)
        deltas.append(
            Delta(name, ra.subjects[name].metrics, rb.subjects[name].metrics, mcnemar(a_right, b_right), len(a_right))
        )
    return Comparison(
        ra, rb, deltas, [n for n in names_a if n not in names_b], [n for n in names_b if n not in names_a]
    )


# --- HTML ---------------------------------------------------------------------------------------


def _num(v: float | None, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _metric_cells(metrics: dict[str, Metric]) -> str:
    return "".join(f'<td title="{escape(m.reason)}">{escape(m.text())}</td>' for m in metrics.values())


def html_report(r: EvalReport) -> str:
    """A self-contained page: tables, PR/ROC curves inline (``data:`` URIs), no script."""
    head = (
        "<tr><th>subject</th><th>labelled</th><th>unjudged</th><th>tp</th><th>fp</th><th>fn</th><th>tn</th>"
        + "".join(f"<th>{m}</th>" for m in METRICS)
        + "<th>p50 ms</th><th>p95 ms</th><th>LLM $</th></tr>"
    )
    rows = []
    for name, s in r.subjects.items():
        c = s.confusion
        rows.append(
            f"<tr><td>{escape(name)}</td><td>{s.labelled}</td><td>{s.unjudged}</td><td>{c.tp}</td><td>{c.fp}</td>"
            f"<td>{c.fn}</td><td>{c.tn}</td>{_metric_cells(s.metrics)}<td>{_num(s.latency_p50_ms, 1)}</td>"
            f"<td>{_num(s.latency_p95_ms, 1)}</td><td>{_num(s.cost_usd, 4)}</td></tr>"
        )
    sections = []
    for name, s in r.subjects.items():
        if s.sweep is None:
            continue
        pr, roc = plot_curves(s.sweep)
        sug = ""
        if s.suggestion is not None:
            g = s.suggestion
            sug = (
                f"<p>Suggested threshold for {escape(g.target)}: <b>{_num(g.threshold, 4)}</b> "
                f"(precision {_num(g.precision)}, recall {_num(g.recall)})</p>"
                if g.threshold is not None
                else f"<p class=note>{escape(g.reason)}</p>"
            )
        sections.append(
            f"<h3>{escape(name)}</h3><p>Current threshold {_num(s.sweep.current, 4)}; ROC AUC "
            f"{_num(s.sweep.auc_roc)}; average precision {_num(s.sweep.average_precision)}.</p>{sug}"
            f"{png_img(pr, name + ' precision-recall')}{png_img(roc, name + ' ROC')}"
        )
    wrong = []
    for name, s in r.subjects.items():
        for w in s.wrong:
            wrong.append(
                f"<tr><td>{escape(name)}</td><td>{escape(w.row.id)}</td><td>{w.row.line}</td><td>{escape(w.expected)}</td>"
                f"<td>{escape(w.got)}</td><td>{_num(w.score, 4)}</td><td>{_num(w.threshold, 4)}</td></tr>"
            )
    cases = cases_yaml(r)
    notes = "".join(f"<p class=note>{escape(n)}</p>" for n in r.notes)
    errors = "".join(f"<tr><td>{escape(i)}</td><td>{escape(e)}</td></tr>" for i, e in r.errors)
    failed = (
        f"<h2>Rows that could not be evaluated</h2><table><tr><th>id</th><th>error</th></tr>{errors}</table>"
        if errors
        else ""
    )
    body = f"""<h1>Eval of {escape(r.policy)} {escape(r.version)}</h1>
<p>{r.rows} row(s) evaluated ({escape(r.where)}) in {r.wall_s:.2f}s. Intervals: {int(CONFIDENCE * 100)}% bootstrap,
{BOOTSTRAP_RESAMPLES} resamples, seed {r.seed}. A violation (a rule failing, a decision not passing) is the
positive class; "undefined" means the metric's denominator is zero.</p>
{notes}
<h2>Measures</h2>
<table>{head}{"".join(rows)}</table>
<p>{escape(r.latency_text)}.</p>
{failed}
<h2>Threshold sweeps</h2>
{"".join(sections) or "<p>No scored rule with labels.</p>"}
<h2>Wrong rows</h2>
<table><tr><th>subject</th><th>id</th><th>line</th><th>expected</th><th>got</th><th>score</th><th>threshold</th></tr>
{"".join(wrong)}</table>
<h2>As test_cases</h2>
<pre>{escape(cases) or "(none)"}</pre>
"""
    return page(f"Eval of {r.policy}", body)


def compare_html(c: Comparison) -> str:
    rows = []
    for d in c.deltas:
        cells = "".join(
            f"<td>{escape(d.a[m].text())}</td><td>{escape(d.b[m].text())}</td><td>{_num(d.delta(m))}</td>"
            for m in METRICS
        )
        rows.append(
            f"<tr><td>{escape(d.subject)}</td><td>{d.paired}</td>{cells}<td>{d.test.b}/{d.test.c}</td>"
            f"<td>{d.test.p_value:.4g} ({d.test.method})</td><td>{escape(d.verdict())}</td></tr>"
        )
    head = (
        "<tr><th>subject</th><th>paired rows</th>"
        + "".join(f"<th>{m} A</th><th>{m} B</th><th>Δ</th>" for m in METRICS)
        + "<th>A-only/B-only right</th><th>McNemar p</th><th>verdict</th></tr>"
    )
    body = f"""<h1>Compare A = {escape(c.a.label)} with B = {escape(c.b.label)}</h1>
<p>{c.a.rows} row(s). McNemar: exact binomial below 25 discordant rows, else chi-square with continuity.</p>
<table>{head}{"".join(rows)}</table>"""
    return page("Compare", body)
