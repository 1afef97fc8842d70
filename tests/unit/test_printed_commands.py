"""Every command the CLI prints for its user to run pastes into a shell as printed: names and
paths are quoted (crossaudit/kernel/shell.py), so ``Offline Demo`` is one word and a name holding
``$(…)`` runs nothing. Each hint is parsed back with shlex and, for the CLI's own commands, by
the CLI's parser: the words it gets are the names that were meant."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from crossaudit.kernel.errors import ConfigurationError
from crossaudit.kernel.shell import command

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["Offline Demo", "it's $(touch pwned) `id`", "plain-name"]  # policy names are free text


def parsed(line: str) -> list[str]:
    """A printed command as a POSIX shell splits it."""
    return shlex.split(line.strip())


def candidate(name: str, environment: str, mode: str = "shadow") -> SimpleNamespace:
    c = SimpleNamespace(
        mode=SimpleNamespace(value=mode),
        share=0.1,
        canary_key="user_id",
        environment=environment,
        version=2,
        active_version=1,
    )
    return SimpleNamespace(candidate=c, version=SimpleNamespace(name=name))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("environment", ["production", "staging area"])
def test_the_deploy_hint_pastes_as_the_commands_it_names(name: str, environment: str) -> None:
    """`policy deploy --shadow` printed `crossaudit policy shadow-report Offline Demo` (two words);
    each follow-up now parses to the candidate's name and environment, and the CLI accepts it."""
    from crossaudit.cli.main import build_parser
    from crossaudit.cli.rollout import describe_candidate

    text = describe_candidate(candidate(name, environment))
    lines = [line for line in text.splitlines() if line.strip().startswith("crossaudit ")]
    assert [parsed(line)[2] for line in lines] == ["shadow-report", "promote", "discard"], text
    for line in lines:
        args = build_parser().parse_args(parsed(line)[1:])
        assert args.name == name and args.environment == environment, line


def test_a_private_file_hint_pastes(tmp_path: Path) -> None:
    from crossaudit.kernel.configfile import check_private_file

    path = tmp_path / "my keys.yaml"
    path.write_text("tenants: {}\n")
    path.chmod(0o644)
    with pytest.raises(ConfigurationError) as err:
        check_private_file(path, "API keys file")
    assert parsed(err.value.message.rsplit("run: ", 1)[1]) == ["chmod", "600", str(path)]


def test_the_tamper_hint_and_the_model_store_hints_paste() -> None:
    from crossaudit.governance.vault import TenantKey
    from crossaudit.kernel.errors import RetainedInputsTamperedError
    from crossaudit.modelserver.sources import import_command

    key = TenantKey.of("acme", "k1", b"\0" * 32)
    nonce, sealed = key.seal("d 1", b"text")
    with pytest.raises(RetainedInputsTamperedError) as err:
        key.open("d 1", nonce, sealed[:-1] + bytes([sealed[-1] ^ 1]))
    (erase,) = re.findall(r"`([^`]+)`", err.value.message)
    assert parsed(erase) == ["crossaudit", "audit", "erase", "--decision", "d 1"]
    (hint,) = re.findall(r"`([^`]+)`", import_command("detoxify", "unbiased", ("--store", "model store/here")))
    assert parsed(hint) == ["crossaudit", "models", "import", "detoxify", "PATH", "--variant", "unbiased", "--store",
                            "model store/here"]  # fmt: skip


def test_command_quotes_only_what_the_shell_would_split_or_expand() -> None:
    assert command("crossaudit", "policy", "promote", "support-bot") == "crossaudit policy promote support-bot"
    assert command("crossaudit", "policy", "promote", "Offline Demo") == "crossaudit policy promote 'Offline Demo'"
    for name in NAMES:
        assert parsed(command("crossaudit", "policy", "discard", name)) == ["crossaudit", "policy", "discard", name]


# A command written into a message with a value interpolated inside it: `crossaudit ... {name}`,
# "run: chmod 600 {path}", "check it with: crossaudit ... {path}". Such values go through command().
UNQUOTED = re.compile(r"""(`|(?:run|with):\s+)(?:crossaudit|chmod|python -m|pip) [^`"']*\{""")


def test_no_message_interpolates_a_value_into_a_printed_command() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for tree in ("crossaudit", "orchestrator", "sandbox")
        for path in sorted((ROOT / tree).rglob("*.py"))
        if "/v1/" not in str(path)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if UNQUOTED.search(line) and re.search(r"\bf[\"']", line)
    ]
    assert not found, "quote them with crossaudit.kernel.shell.command:\n" + "\n".join(found)
