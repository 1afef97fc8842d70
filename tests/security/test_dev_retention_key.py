"""``serve --dev --retain-inputs 7d``: the dev tenant's inputs are retained under an operator key
the server makes in its data directory (crossaudit/governance/retention.py ``dev_operator_key``).

As an attacker sees it: the key is 0600 in the 0700 data directory whatever the umask, never in
the working directory, never in a log line; a key file planted there before (a link, another
user's file, a readable one, one linked elsewhere too) is refused rather than used, since a key
someone else knows would open every retained input; two workers starting at once agree on one
key; and the flag is refused outside --dev, where the operator gives a real key file."""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from crossaudit.governance.retention import DEV_OPERATOR_KEY_FILE, dev_operator_key, with_dev_operator_key
from crossaudit.governance.vault import KEY_BYTES, OperatorKey
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.service.assembly import check_config, secure_data_dir
from crossaudit.service.auth import Authenticator
from crossaudit.service.config import DEV_TENANT, ServerConfig
from tests.e2e.conftest import write_keys

ROOT = Path(__file__).resolve().parents[2]
WEEK_S = 7 * 86_400.0
OTHER_UID = 65_534  # nobody: the owner of a key file planted by another local user
CONCURRENT_STARTS = 8  # workers of one server making the key at once


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def dev_config(data_dir: Path, **changes: object) -> ServerConfig:
    return dataclasses.replace(ServerConfig(dev=True, retain_inputs="7d", data_dir=data_dir), **changes)  # type: ignore[arg-type]


def private_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    secure_data_dir(data)  # what the server does when it locks the data directory, before the key
    return data


def serve(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSAUDIT_")}
    return subprocess.run(
        [sys.executable, "-m", "crossaudit.cli", "serve", "--host", "127.0.0.1", "--port", "0", *args],
        cwd=cwd, capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip


def test_the_key_is_made_once_0600_in_the_data_directory_whatever_the_umask(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = private_dir(tmp_path)
    old = os.umask(0)  # the most careless umask: a plain create would be 0666
    try:
        with caplog.at_level(logging.INFO, logger="crossaudit.service.retention"):
            config = with_dev_operator_key(dev_config(data))
    finally:
        os.umask(old)
    path = config.retention.operator_key_file
    assert path == data / DEV_OPERATOR_KEY_FILE and mode(path) == 0o600 and mode(data) == 0o700
    text = path.read_text()
    assert len(base64.b64decode(text.strip(), validate=True)) == KEY_BYTES
    assert OperatorKey.load(path, None, "key").key == base64.b64decode(text)  # what the server loads
    assert str(path) in caplog.text and text.strip() not in caplog.text  # its path is logged, never the key
    assert sorted(p.name for p in data.iterdir()) == [DEV_OPERATOR_KEY_FILE]  # no temporary file left
    assert with_dev_operator_key(dev_config(data)).retention.operator_key_file == path
    assert path.read_text() == text  # kept across restarts: what it sealed stays readable


def test_workers_starting_at_once_agree_on_one_key(tmp_path: Path) -> None:
    data = private_dir(tmp_path)
    paths: list[Path] = []
    start = threading.Barrier(CONCURRENT_STARTS)

    def make() -> None:
        start.wait()
        paths.append(dev_operator_key(data))

    threads = [threading.Thread(target=make) for _ in range(CONCURRENT_STARTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert paths == [data / DEV_OPERATOR_KEY_FILE] * CONCURRENT_STARTS
    assert sorted(p.name for p in data.iterdir()) == [DEV_OPERATOR_KEY_FILE]


def plant_link(data: Path, tmp_path: Path) -> None:
    (tmp_path / "attacker.key").write_text(base64.b64encode(b"k" * KEY_BYTES).decode())
    (data / DEV_OPERATOR_KEY_FILE).symlink_to(tmp_path / "attacker.key")


def plant_readable(data: Path, tmp_path: Path) -> None:
    key = data / DEV_OPERATOR_KEY_FILE
    key.write_text(base64.b64encode(b"k" * KEY_BYTES).decode())
    key.chmod(0o644)


def plant_hard_link(data: Path, tmp_path: Path) -> None:
    key = data / DEV_OPERATOR_KEY_FILE
    key.write_text(base64.b64encode(b"k" * KEY_BYTES).decode())
    key.chmod(0o600)
    os.link(key, tmp_path / "a-copy-someone-else-reads")


def plant_fifo(data: Path, tmp_path: Path) -> None:
    os.mkfifo(data / DEV_OPERATOR_KEY_FILE, 0o600)  # would hang a reader that opened it


@pytest.mark.parametrize(
    ("plant", "problem"),
    [
        (plant_link, "is not a regular file"),
        (plant_readable, "accessible by group or others"),
        (plant_hard_link, "other links"),
        (plant_fifo, "is not a regular file"),
    ],
)
def test_a_planted_key_file_is_refused_not_used(tmp_path: Path, plant: object, problem: str) -> None:
    data = private_dir(tmp_path)
    plant(data, tmp_path)  # type: ignore[operator]
    with pytest.raises(ConfigurationError, match=problem) as err:
        with_dev_operator_key(dev_config(data))
    assert DEV_OPERATOR_KEY_FILE in err.value.message and "kkkk" not in err.value.message


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_another_users_key_file_is_refused(tmp_path: Path) -> None:
    data = private_dir(tmp_path)
    key = data / DEV_OPERATOR_KEY_FILE
    key.write_text(base64.b64encode(b"k" * KEY_BYTES).decode())
    key.chmod(0o600)
    os.chown(key, OTHER_UID, OTHER_UID)
    with pytest.raises(ConfigurationError, match="belongs to another user"):
        with_dev_operator_key(dev_config(data))


def test_a_configured_key_is_used_and_nothing_is_generated(tmp_path: Path) -> None:
    data = private_dir(tmp_path)
    config = dev_config(data)
    given = dataclasses.replace(config, retention=dataclasses.replace(config.retention, operator_key_env="MY_KEY"))
    assert with_dev_operator_key(given) is given
    assert with_dev_operator_key(dev_config(data, retain_inputs="off")).retention.operator_key_file is None
    assert with_dev_operator_key(dev_config(data, retain_inputs=None)).retention.operator_key_file is None
    assert not list(data.iterdir())


def test_the_dev_tenant_retains_for_the_duration_given() -> None:
    assert Authenticator.dev_mode(retention_s=WEEK_S).grants.retention == {DEV_TENANT: WEEK_S}
    assert Authenticator.dev_mode().grants.retention == {}


def test_the_flag_is_refused_outside_dev_where_the_operator_gives_a_real_key(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys.yaml")
    with pytest.raises(ConfigurationError, match="--retain-inputs is for --dev") as err:
        check_config(ServerConfig(api_keys_file=keys, retain_inputs="7d", allow_process_sandbox=True))
    assert "retention.operator_key_file" in err.value.message and "API-keys file" in err.value.message
    with pytest.raises(ConfigurationError, match=r"retention\.max_inputs_s"):
        check_config(ServerConfig(dev=True, retain_inputs="60d"))
    res = serve("--api-keys", str(keys), "--retain-inputs", "7d", "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.returncode == 1 and len(errors) == 1 and "--retain-inputs is for --dev" in errors[0], res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert not (tmp_path / "d").exists(), "nothing is made before the configuration is accepted"
    res = serve("--dev", "--retain-inputs", "sevendays", "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    assert res.returncode == 1 and "retain_inputs" in res.stderr and "sevendays" in res.stderr, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys.yaml"]  # no key in the working directory
