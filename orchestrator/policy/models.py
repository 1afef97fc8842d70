"""Whether the models a policy's builtins need are available where it will run (validate/deploy).

"Where it will run" is the environment its evaluators get: on the service, the operator's
settings (the server's environment; a policy may not name model files there); locally, this
process's environment or PolicyTester's ``env``. The answer is the runtime's own resolution
(:func:`crossaudit.modelserver.builtins.model_problem`), run exactly as a call runs it, so the
check and the call cannot disagree. A problem is located at the config field that asks for the
model (Presidio: ``entities``, when it lists PERSON and no NER pipeline is available).
"""

from __future__ import annotations

from collections.abc import Mapping

from crossaudit.kernel.dsl import EvaluatorType, Policy
from crossaudit.kernel.errors import PolicyIssue
from crossaudit.kernel.yamlsafe import Path
from crossaudit.modelserver.builtins import model_problem
from orchestrator.policy.validate import IssueAt, PolicyCheck


def model_problems(policy: Policy, environ: Mapping[str, str] | None = None) -> list[tuple[Path, str]]:
    """(field path, message) for each builtin whose model is not available."""
    out: list[tuple[Path, str]] = []
    for i, spec in enumerate(policy.evaluators):
        if spec is None or spec.kind is not EvaluatorType.BUILTIN or spec._typed is None:
            continue  # not a builtin, or its config is invalid (reported by validation)
        problem = model_problem(spec._typed, environ)
        if problem is not None:
            out.append((("evaluators", i, "config", problem.field), problem.message))
    return out


def model_check(environ: Mapping[str, str] | None = None) -> PolicyCheck:
    """A :data:`PolicyCheck` for ``load_policy(checks=...)``: unavailable models are errors
    (``environ`` None = this process's environment, read when the check runs)."""

    def check(policy: Policy, issue_at: IssueAt) -> list[PolicyIssue]:
        return [issue_at(path, message) for path, message in model_problems(policy, environ)]

    return check
