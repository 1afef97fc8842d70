"""``crossaudit --version`` and shell completion through the real path: the script
``crossaudit completion bash`` prints is eval'ed by bash, whose completion function calls the
``crossaudit`` command back."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from crossaudit.cli.main import main

BASH_TIMEOUT_S = 120


def test_version_prints_the_installed_package_version(capsys) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"crossaudit {version('crossaudit')}\n"


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_a_script_for_each_shell(shell: str, capsys) -> None:
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    assert "_ARGCOMPLETE" in script and "crossaudit" in script
    if shell == "zsh":
        assert "compdef _python_argcomplete crossaudit" in script
    if shell == "fish":
        assert "complete --command crossaudit" in script


def test_completion_refuses_an_unknown_shell(capsys) -> None:
    assert main(["completion", "powershell"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def _shim(tmp_path: Path) -> Path:
    """A ``crossaudit`` on PATH that runs this interpreter's CLI (as the installed script does)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "crossaudit"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m crossaudit.cli "$@"\n')
    shim.chmod(0o755)
    return bin_dir


def _complete(bin_dir: Path, line: str) -> list[str]:
    """What bash offers after ``line`` once the completion script is eval'ed."""
    words = line.split(" ")
    program = f"""
set -e
eval "$(crossaudit completion bash)"
complete -p crossaudit >/dev/null
COMP_LINE={line!r}
COMP_POINT=${{#COMP_LINE}}
COMP_WORDS=({" ".join(repr(w) for w in words)})
COMP_CWORD={len(words) - 1}
_python_argcomplete crossaudit {words[-1]!r} {words[-2]!r}
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSAUDIT_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        ["bash", "-c", program], capture_output=True, text=True, env=env, timeout=BASH_TIMEOUT_S, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return [w.strip() for w in proc.stdout.splitlines() if w.strip()]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_commands_subcommands_and_choices(tmp_path: Path) -> None:
    bin_dir = _shim(tmp_path)
    assert _complete(bin_dir, "crossaudit pol") == ["policy"]
    assert set(_complete(bin_dir, "crossaudit review ")) - {"-h", "--help"} == {"list", "resolve"}
    assert _complete(bin_dir, "crossaudit review resolve some-id --state app") == ["approved"]
    assert "--environment" in _complete(bin_dir, "crossaudit policy deploy --env")
    assert set(_complete(bin_dir, "crossaudit completion ")) - {"-h", "--help"} == {"bash", "zsh", "fish"}
