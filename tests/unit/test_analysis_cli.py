"""``crossaudit policy analyze``, ``policy diff --symbolic``, ``policy validate``'s analysis warnings
and ``policy deploy --analyze``: exit codes and output, through the command's entry point (no
server)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from crossaudit.cli.main import main

HEAD = 'name: T\ndescription: d\nversion: "1.0"\nevaluators:\n' + "".join(
    f"  - {{name: {n}, type: custom, config: {{code: 'def evaluate(p, r, c): return {{}}'}}}}\n" for n in "ab"
)
CLEAN = HEAD + "rules:\n  - {name: r, evaluator: a, threshold: 0.5, action: block}\n"
WARNS = HEAD + (
    "rules:\n  - {name: strict_first, evaluator: a, threshold: 0.5, action: block, priority: 100}\n"
    "  - {name: dead_second, evaluator: a, threshold: 0.3, action: block, priority: 50}\n"
)
ERRS = HEAD + (
    "rules:\n  - name: never_applies\n    evaluator: a\n"
    "    conditions: [{field: content.length, operator: greater_than, value: 100},"
    " {field: content.length, operator: in, value: [10, 20]}]\n"
)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_analyze_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "analyze", write(tmp_path, "clean.yaml", CLEAN)]) == 0
    warns = write(tmp_path, "warns.yaml", WARNS)
    assert main(["policy", "analyze", warns]) == 0  # --fail-on error (the default): warnings pass
    assert main(["policy", "analyze", warns, "--fail-on", "warning"]) == 1
    assert main(["policy", "analyze", write(tmp_path, "errs.yaml", ERRS)]) == 1
    assert main(["policy", "analyze", str(tmp_path / "missing.yaml")]) == 2
    assert main(["policy", "analyze", write(tmp_path, "bad.yaml", HEAD + "rules: [{name: r, evaluator: nope}]\n")]) == 2
    out = capsys.readouterr()
    assert "[never-decides] dead_second never changes the decision" in out.out
    assert "witness: a score" in out.out and "engine (reproduced)" in out.out
    assert "[conditions-never-hold] never_applies" in out.out
    assert "not found" in out.err and "undefined evaluator" in out.err


def test_analyze_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "analyze", write(tmp_path, "warns.yaml", WARNS), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["counts"] == {"info": 0, "warning": 1, "error": 0}
    (f,) = doc["findings"]
    assert f["kind"] == "never-decides" and f["rules"] == ["dead_second"] and f["proved"] is True
    assert set(f) == {"kind", "severity", "rules", "message", "proved", "witness", "engine"}
    assert set(f["witness"]) == {"stage", "evaluators", "context"}
    assert f["engine"]["rules"]["dead_second"] == "skipped"


def test_symbolic_diff_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write(tmp_path, "old.yaml", CLEAN)
    same = write(tmp_path, "same.yaml", HEAD + "rules:\n  - {action: block, threshold: 0.50, evaluator: a, name: r}\n")
    new = write(tmp_path, "new.yaml", CLEAN.replace("0.5", "0.72"))
    assert main(["policy", "diff", old, same, "--symbolic"]) == 0
    assert "equivalent" in capsys.readouterr().out
    assert main(["policy", "diff", old, new, "--symbolic"]) == 1
    assert "passes, allow -> fails, block when a's score in [0.5, 0.72)" in capsys.readouterr().out
    assert main(["policy", "diff", old, new, "--symbolic", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["equivalent"] is False and len(doc["regions"]) == 1
    assert set(doc) == {"old", "new", "equivalent", "regions", "rules", "truncated", "not_modelled",
                        "analysis_bugs", "seconds", "solver"}  # fmt: skip


def test_validate_shows_the_findings_and_can_skip_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    warns = write(tmp_path, "warns.yaml", WARNS)
    assert main(["policy", "validate", warns]) == 0
    assert "warning: analysis warning: [never-decides] dead_second" in capsys.readouterr().out
    assert main(["policy", "validate", warns, "--strict"]) == 1
    capsys.readouterr()
    assert main(["policy", "validate", warns, "--no-analyze"]) == 0
    assert "analysis" not in capsys.readouterr().out
    assert main(["policy", "validate", warns, "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert [f["kind"] for f in entry["analysis"]] == ["never-decides"]


def test_deploy_refuses_a_policy_with_errors_before_any_upload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # no server listens on this port: the refusal comes before any connection
    code = main(["policy", "deploy", write(tmp_path, "errs.yaml", ERRS), "--analyze", "error",
                 "--server", "127.0.0.1:9"])  # fmt: skip
    assert code == 1
    captured = capsys.readouterr()
    assert "not deployed: 1 finding(s) at or above error" in captured.err
    assert "[conditions-never-hold]" in captured.out


def test_the_installed_command(tmp_path: Path) -> None:
    """The entry point as a user runs it (a fresh process: z3 imported by the command itself)."""
    exe = Path(sys.executable).parent / "crossaudit"
    done = subprocess.run([str(exe), "policy", "analyze", write(tmp_path, "errs.yaml", ERRS), "--json"],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["counts"]["error"] == 1
