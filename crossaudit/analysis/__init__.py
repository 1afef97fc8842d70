"""Static analysis of policies with an SMT solver (z3): ``crossaudit policy analyze`` and
``crossaudit policy diff --symbolic`` (docs/analysis.md).

A policy is encoded as formulas over its inputs: each evaluator's score in [0, 1], whether it gave
a verdict and whether it said ``passed: false`` (shared by every rule that uses it), the context
fields its conditions and dynamic thresholds read (typed, with the engine's missing-field rule),
and the request's stage. The engine's order, stops, chaining, consensus, fallbacks and
``on_error`` are encoded from the same functions the engine runs (:func:`orchestrator.engine.engine.plan`,
:func:`~orchestrator.engine.engine.no_verdict_action`). Every counterexample the solver finds is
evaluated by the real engine (through its replay hook, the evaluator results pinned to the
counterexample's values) before it is reported: one it does not reproduce is reported as a bug of
the analysis, never as a finding.

Layer: above the orchestrator, beside the evidence package; it imports neither the service nor
the store (the CLI wires a server's policies in).
"""

from crossaudit.analysis.findings import AnalysisReport, Finding, analyze
from crossaudit.analysis.solve import SolverLimits
from crossaudit.analysis.symdiff import DiffReport, symbolic_diff

__all__ = ["AnalysisReport", "DiffReport", "Finding", "SolverLimits", "analyze", "symbolic_diff"]
