"""The README stays true: its local commands and SDK snippet run as written, its layout
section names every package of the tree (and nothing that is not there), and the
architecture page names only modules that exist."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CLI_TIMEOUT_S = 300


def section(title: str) -> str:
    start = README.index(f"\n{title}\n")
    nxt = re.search(r"\n#{2,3} ", README[start + len(title) + 2 :])
    return README[start : start + len(title) + 2 + (nxt.start() if nxt else len(README))]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_layout_section_matches_the_tree() -> None:
    (layout,) = blocks(section("## Layout"), "")
    listed = {line.split()[0].rstrip("/") for line in layout.splitlines() if line.strip()}
    for path in listed:
        assert (ROOT / path).exists(), f"README layout names {path}, which does not exist"
    packages = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "crossaudit").glob("*/__init__.py")}
    packages |= {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"crossaudit"}  # listed by subpackage
    assert packages <= listed, f"packages missing from the README layout: {sorted(packages - listed)}"
    top = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "__pycache__"}
    top -= {"build", "dist"} | {p.name for p in ROOT.glob("*.egg-info")}
    assert top <= {p.split("/")[0] for p in listed}, f"top-level directories missing: {sorted(top - listed)}"


def test_policy_tester_snippet_gives_the_values_it_shows(monkeypatch) -> None:
    snippet = next(b for b in blocks(README, "python") if "PolicyTester(" in b)
    monkeypatch.chdir(ROOT)
    scope: dict[str, object] = {}
    exec(compile(snippet, "README.md", "exec"), scope)  # the snippet as written, in the repository root
    result = scope["result"]
    shown = dict(re.findall(r"^\s+result\.(\w+)\s+# (.+)$", snippet, flags=re.M))
    assert json.loads(shown["passed"].lower()) == result.passed
    assert json.loads(shown["action"]) == result.action
    assert json.loads(shown["modified_response"]) == result.modified_response


def test_the_custom_evaluator_example_is_a_whole_policy_that_runs(tmp_path: Path) -> None:
    """The section used to show only the function: a policy written from it lacked the required
    ``description`` and was refused. Its policy, with its code where the comment puts it, passes
    ``policy test`` as written."""
    text = section("### Custom evaluators")
    (code,) = [b for b in blocks(text, "python") if "def evaluate(" in b]
    (policy,) = blocks(text, "yaml")
    doc = yaml.safe_load(policy)
    assert {"name", "description", "version"} <= set(doc), "a policy's required fields"
    (custom,) = [e for e in doc["evaluators"] if e["type"] == "custom"]
    assert f"# evaluators/{custom['name']}.py" in code
    (tmp_path / "evaluators").mkdir()
    (tmp_path / "evaluators" / f"{custom['name']}.py").write_text(code)
    (tmp_path / "my_policy.yaml").write_text(policy)
    assert "my_policy.yaml" in policy.splitlines()[0]
    cli = [sys.executable, "-m", "crossaudit.cli", "policy"]
    proc = subprocess.run([*cli, "test", "my_policy.yaml", "--sandbox", "process"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=CLI_TIMEOUT_S, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert "1 passed, 0 failed" in proc.stdout
    without = "\n".join(line for line in policy.splitlines() if not line.startswith("description:"))
    (tmp_path / "my_policy.yaml").write_text(without)
    refused = subprocess.run([*cli, "validate", "my_policy.yaml"], capture_output=True, text=True, cwd=tmp_path,
                             timeout=CLI_TIMEOUT_S, check=False)  # fmt: skip
    said = "missing required field 'description'"
    assert refused.returncode == 1 and said in refused.stdout and said in text  # as the README says


def test_architecture_doc_names_only_modules_that_exist() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`([a-z_0-9/]+(?:\.py|/))`", doc))
    assert named, "docs/architecture.md names no modules"
    missing = sorted(n for n in named if not (ROOT / "crossaudit" / n).exists() and not (ROOT / n).exists())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_keys_files_shown_in_the_readme_load_as_described(tmp_path: Path, monkeypatch) -> None:
    """Every API-keys file the README shows is accepted, with the roles and grants it claims."""
    from crossaudit.service.auth import Authenticator
    from crossaudit.service.principals import Role

    monkeypatch.setenv("ACME_WEBHOOK_SIGNING", "a-signing-secret-of-32-characters")
    files = [b for b in blocks(README, "yaml") if "tenants:" in b]
    assert len(files) >= 2
    for i, text in enumerate(files):
        path = tmp_path / f"keys{i}.yaml"
        path.write_text(text)
        path.chmod(0o600)
        auth = Authenticator.from_file(path)
        assert "acme" in auth.tenants
    alice = auth.principal_for_key("acme-alice-key-at-least-16")
    assert (alice.role, alice.name, tuple(alice.reviewer_roles)) == (Role.REVIEWER, "alice", ("content_moderator",))
    assert auth.principal_for_key("acme-checkout-key-16chars").role is Role.SERVICE
    assert auth.grants.webhook("acme").url_problem("https://hooks.acme.example/violations") is None


def test_client_without_a_target_uses_the_environment_as_the_readme_says(monkeypatch) -> None:
    from crossaudit import Client

    assert "CROSSAUDIT_SERVER" in README
    monkeypatch.setenv("CROSSAUDIT_SERVER", "127.0.0.1:50999")
    monkeypatch.setenv("CROSSAUDIT_API_KEY", "key-from-the-environment-123")
    with Client() as c:
        assert c.target.endswith("127.0.0.1:50999")
        assert ("authorization", "Bearer key-from-the-environment-123") in list(c._md)
    monkeypatch.delenv("CROSSAUDIT_SERVER")
    with Client() as c:
        assert c.target.endswith("127.0.0.1:50051")


def test_the_rpcs_the_readme_names_exist() -> None:
    """The README's API paragraph names only methods the protos define (no promised RPC that is
    not there), and the ServerInfo fields it lists are what ``client.server_info()`` returns."""
    import dataclasses
    import importlib

    from grpc_health.v1 import health_pb2

    from crossaudit.api.models import ServerInfo

    services = {}
    for module in ("audit", "delivery", "evaluation", "evaluator", "info", "policy", "replay", "review"):
        services.update(importlib.import_module(f"crossaudit.v1.{module}_pb2").DESCRIPTOR.services_by_name)
    services["grpc.health.v1"] = health_pb2.DESCRIPTOR.services_by_name["Health"]
    paragraph = README[README.index("APIs (`crossaudit/v1/`)") :]
    paragraph = paragraph[: paragraph.index("\n\n")]
    named = re.findall(r"`([\w.]+)` \(([^)]*)\)", paragraph.replace("\n", " "))
    assert {name for name, _ in named} >= {"PolicyService", "InfoService", "grpc.health.v1"}, named
    for service, methods in named:
        declared = [m.name for m in services[service].methods]
        listed = re.split(r"[:;]", methods)[0]  # what follows ':' or ';' describes, it names no method
        for word in (part.split()[0] for part in listed.split(",")):
            assert any(m.startswith(word) for m in declared), f"README names {service}.{word}; it has {declared}"
    assert "client.server_info().weaker_isolation" in README
    fields = {f.name for f in dataclasses.fields(ServerInfo)}
    assert {"version", "tenant", "sandbox_backend", "isolation", "weaker_isolation"} <= fields


def test_one_command_form_and_how_to_put_it_on_the_path() -> None:
    """The README's commands all say ``crossaudit`` (never ``.venv/bin/crossaudit`` beside it), and
    its opening lines say how that command gets on the PATH after ``make``."""
    code = "\n".join(blocks(README, "bash") + blocks(README, "python"))
    assert ".venv/bin/crossaudit" not in code
    opening = README[: README.index("\n## ")]
    assert "source .venv/bin/activate" in opening and "make serve" in opening and "make test" in opening


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_relative_links_resolve_inside_the_repository() -> None:
    """Every relative link of the README and docs/ names a file of this repository (the DSL guide
    is shipped as docs/policy-dsl-guide.md), and each #anchor names a heading of its target."""

    def anchors(path: Path) -> set[str]:
        heads = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}

    broken = []
    for md in _markdown_files():
        text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if ROOT not in dest.parents and dest != ROOT:
                broken.append(f"{md.relative_to(ROOT)}: {target} leaves the repository")
            elif not dest.exists():
                broken.append(f"{md.relative_to(ROOT)}: {target} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{md.relative_to(ROOT)}: {target} names no heading")
    assert not broken, "\n".join(broken)


def test_make_help_lists_every_target() -> None:
    makefile = (ROOT / "Makefile").read_text()
    phony = set(re.search(r"^\.PHONY: (.+)$", makefile, flags=re.M).group(1).split())  # type: ignore[union-attr]
    shown = subprocess.run(["make", "-s", "-C", str(ROOT), "help"], capture_output=True, text=True, timeout=60,
                           check=True).stdout
    listed = {line.split()[0] for line in re.sub(r"\x1b\[[0-9;]*m", "", shown).splitlines() if line.strip()}
    assert phony - listed == set(), f"make help omits {sorted(phony - listed)}"


def test_make_bench_says_what_it_installs_before_installing_it() -> None:
    """``make bench`` installs torch (~3 GB), PostgreSQL and a peer: it says so before the first install
    (a dry run: nothing is installed here)."""
    dry = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), "bench"], capture_output=True, text=True, timeout=120,
                         check=True).stdout.splitlines()
    first_install = next(i for i, line in enumerate(dry)
                         if ("pip" in line and " install " in line) or " sync --locked" in line)
    said = " ".join(line for line in dry[:first_install] if line.startswith("echo"))
    for thing in ("torch", "PostgreSQL", "Guardrails AI", ".venv-bench"):
        assert thing in said, f"make bench does not say it installs {thing} before installing"


# Secret files the README and docs tell a user to create in the working directory (the repository
# root when following the README): an operator key, an API-keys file, an evidence signing key.
SECRET_FILES_THE_DOCS_CREATE = ("operator.key", "keys.yaml", "signing.pem")


def test_the_secret_files_the_docs_create_are_ignored_by_git() -> None:
    import shutil

    docs = README + "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    for name in SECRET_FILES_THE_DOCS_CREATE:
        assert re.search(rf"(?<![\w/.-]){re.escape(name)}\b", docs), f"the docs no longer create {name}: drop it"
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "--no-index", "--verbose", "--non-matching",
         *SECRET_FILES_THE_DOCS_CREATE],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False,
    )  # fmt: skip
    unignored = [line.split("\t")[-1] for line in proc.stdout.splitlines() if line.startswith("::")]
    assert not unignored, f"add to .gitignore: {unignored}"


def test_make_serve_runs_what_the_readme_says_it_runs() -> None:
    """README's ``make serve  # = crossaudit serve …`` is the Makefile's serve line, HOST and PORT filled in."""
    said = re.search(r"^make serve\s+# = (crossaudit serve .+)$", README, flags=re.M)
    assert said, "README no longer says what make serve runs"
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), "serve"], capture_output=True, text=True, timeout=120,
                         check=True).stdout.splitlines()
    ran = next(line for line in dry if " serve --dev" in line)
    assert ran.endswith(said[1].removeprefix("crossaudit")), (ran, said[1])
