"""``crossaudit policy analyze`` on a 60-rule policy and on the guide's examples (docs/analysis.md):
the analysis time (the issue's targets: under 10 s for the 60 rules, under 2 s for each guide
example), the solver time per finding kind, and a ``diff --symbolic`` of a threshold change of the
60-rule policy. In-process (no CLI start-up), one run; nothing is asserted.

``python -m tests.bench analyze``; ``python -m tests.bench.bench_analyze --write FILE`` writes the
60-rule policy to look at.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from crossaudit.analysis import analyze, symbolic_diff
from orchestrator.policy import load_policy, load_policy_file
from tests.bench import report

ROOT = Path(__file__).resolve().parents[2]
RULES = 60
EVALUATORS = 12
TIERS = ["free", "pro", "team", "enterprise"]
ROLES = ["admin", "moderator", "member", "guest"]
ACTIONS = ["block", "require_review", "modify", "flag", "warn", "block"]
CODE = "def evaluate(prompt, response, context):\n    return {'score': 1.0}\n"


def _conditions(i: int) -> list[str]:
    """Two or three conditions of rule ``i`` on several context fields (tiers, roles, length,
    hour, an IP range, a user agent regex). The rules of one evaluator are for different tiers (a
    rule copied for another tier, as policies grow), so few of them shadow each other."""
    out = [f'{{field: user.tier, operator: equals, value: "{TIERS[(i // EVALUATORS) % 4]}"}}']
    if i % 3 == 0:
        out.append(f"{{field: content.length, operator: greater_than, value: {100 * (i % 7)}}}")
    if i % 3 == 1:
        out.append(f'{{field: user.role, operator: not_in, value: ["{ROLES[i % 4]}", "{ROLES[(i + 1) % 4]}"]}}')
    if i % 5 == 0:
        out.append(f"{{field: time.hour, operator: less_than, value: {8 + i % 10}}}")
    if i % 7 == 0:
        out.append('{field: request.ip, operator: in, value: ["10.0.0.0/8", "192.168.1.0/24"]}')
    if i % 11 == 0:
        out.append('{field: request.user_agent, operator: regex_match, value: "^(curl|wget)/[0-9]+"}')
    return out


def sixty_rule_policy(threshold_shift: float = 0.0) -> str:
    lines = ["name: sixty", "description: 60 rules on 12 evaluators, conditions on several fields", 'version: "1.0"',
             "evaluators:"]  # fmt: skip
    for e in range(EVALUATORS):
        lines += [f"  - name: e{e}", "    type: custom", "    config:", "      code: |"]
        lines += [f"        {line}" for line in CODE.splitlines()]
    lines.append("rules:")
    for i in range(RULES):
        threshold = round(0.3 + (i % 7) * 0.08 + (threshold_shift if i == 0 else 0.0), 2)
        lines += [f"  - name: r{i}", f"    priority: {100 - i}", f"    action: {ACTIONS[i % len(ACTIONS)]}"]
        if i % 10 == 9:  # a consensus rule
            lines += [f"    evaluators: [{{name: e{i % EVALUATORS}}}, {{name: e{(i + 1) % EVALUATORS}}}]",
                      "    consensus_strategy: majority", "    on_disagreement: require_review"]  # fmt: skip
        else:
            lines.append(f"    evaluator: e{i % EVALUATORS}")
        if i % 8 == 4:
            lines += ["    threshold: dynamic", "    threshold_config:", f"      base_threshold: {threshold}",
                      "      user_trust_modifier: -0.2", "      content_sensitivity_modifier: 0.1"]  # fmt: skip
        else:
            lines.append(f"    threshold: {threshold}")
        if i % 9 == 2:
            lines.append(f"    fallback: {{evaluator: e{(i + 5) % EVALUATORS}, on_error: warn}}")
        lines.append("    conditions: [" + ", ".join(_conditions(i)) + "]")
    return "\n".join(lines) + "\n"


def main() -> None:
    policy = load_policy(sixty_rule_policy(), "sixty.yaml")
    t0 = time.perf_counter()
    result = analyze(policy)
    wall = time.perf_counter() - t0
    counts = result.to_json()["counts"]
    print(f"analyze, {RULES} rules, {EVALUATORS} evaluators: {wall:.2f} s (target: < 10 s); findings {counts}; "
          f"analysis bugs {len(result.bugs)}")  # fmt: skip
    report.ratio("analyze.sixty_rules_s", wall)
    print("  solver time per finding kind (s, queries):")
    for kind, t in result.timings.to_json().items():
        print(f"    {kind:<34} {t['seconds']:8.3f}  {t['queries']:5d}")
    worst = 0.0
    for path in sorted((ROOT / "policies" / "guide").glob("*.yaml")):
        p = load_policy_file(str(path), env={})
        t0 = time.perf_counter()
        r = analyze(p)
        took = time.perf_counter() - t0
        worst = max(worst, took)
        print(f"  guide {path.name:<40} {took:6.3f} s  {len(r.findings)} finding(s)")
    print(f"guide examples: the slowest {worst:.3f} s (target: < 2 s each)")
    report.ratio("analyze.guide_slowest_s", worst)
    new = load_policy(sixty_rule_policy(threshold_shift=0.15), "sixty-v2.yaml")
    t0 = time.perf_counter()
    d = symbolic_diff(policy, new, ("v1", "v2"))
    took = time.perf_counter() - t0
    print(f"diff --symbolic, r0's threshold 0.3 -> 0.45: {took:.2f} s, {len(d.regions)} region(s), "
          f"{len(d.rules)} rule(s) with another outcome")  # fmt: skip
    report.ratio("analyze.diff_sixty_s", took)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        Path(sys.argv[2]).write_text(sixty_rule_policy(), encoding="utf-8")
    else:
        main()
