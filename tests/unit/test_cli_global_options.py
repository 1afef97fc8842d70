"""A command's options may come before it, as git and kubectl accept them: ``crossaudit --server
H:P policy deploy F`` used to be ``invalid choice: 'H:P'`` (crossaudit/cli/main.py
``hoist_options``). Written after the command they work as before."""

from __future__ import annotations

import pytest

from crossaudit.cli.main import build_parser, hoist_options, main

PARSER = build_parser()


def parse(*argv: str):  # -> argparse.Namespace
    return PARSER.parse_args(hoist_options(PARSER, argv))


def test_connection_options_before_the_command_reach_it() -> None:
    args = parse("--server", "10.0.0.1:50051", "--api-key", "k" * 16, "--timeout", "5", "policy", "deploy", "p.yaml")
    assert (args.server, args.api_key, args.timeout, args.file) == ("10.0.0.1:50051", "k" * 16, 5.0, "p.yaml")
    args = parse("--json", "--server=h:1", "audit", "list", "--limit", "3")
    assert (args.json, args.server, args.limit) == (True, "h:1", 3)
    args = parse("-e", "staging", "--server", "h:1", "policy", "rollback", "Offline Demo")  # a short option too
    assert (args.environment, args.server, args.name) == ("staging", "h:1", "Offline Demo")
    after = parse("policy", "deploy", "p.yaml", "--server", "10.0.0.1:50051")  # after the command, as before
    assert (after.server, after.file) == ("10.0.0.1:50051", "p.yaml")


def test_an_option_whose_value_is_optional_does_not_take_the_command() -> None:
    """``evaluate``'s ``--server [ADDR]``: before a command word it stands alone (the default server)."""
    args = parse("--server", "evaluate", "Offline Demo", "--response", "hi")
    assert args.command == "evaluate" and args.server is not None
    args = parse("--server", "127.0.0.1:50051", "policy", "test", "p.yaml")
    assert (args.server, args.files) == ("127.0.0.1:50051", ["p.yaml"])


def test_the_command_still_judges_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--server", "h:1", "policy", "validate", "p.yaml"]) == 2  # validate never connects
    assert "unrecognized arguments: --server=h:1" in capsys.readouterr().err
    assert main(["--no-such-option", "policy", "list"]) == 2  # left to argparse, one usage error
    capsys.readouterr()
    assert main(["--server", "h:1"]) == 2
    assert "the following arguments are required: COMMAND" in capsys.readouterr().err  # not "invalid choice 'h:1'"


def test_the_programs_own_options_stay_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    assert hoist_options(PARSER, ["--version"]) == ["--version"]
    assert hoist_options(PARSER, ["--help", "policy"]) == ["--help", "policy"]
    with pytest.raises(SystemExit):
        PARSER.parse_args(hoist_options(PARSER, ["--version"]))
    assert capsys.readouterr().out.startswith("crossaudit ")


def test_a_client_command_with_options_before_it_connects(capsys: pytest.CaptureFixture[str]) -> None:
    """Through main, the whole way: the call is made (to a port nothing serves: one error line, exit 1)."""
    code = main(["--server", "127.0.0.1:1", "--api-key", "k" * 16, "--timeout", "2", "policy", "list"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error:") and "invalid choice" not in err, err
