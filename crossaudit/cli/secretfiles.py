"""``crossaudit config secrets DIR``: the secret files the shipped deployments mount
(``deploy/compose.yaml``'s ``secrets:``, the keys of ``deploy/k8s/secret.template.yaml``;
``deploy/secrets/README.md``), made with fresh random values.

Why a command: a deployment that starts without its evidence signing key still serves, but
signs nothing, and only an auditor's ``audit verify`` finds out. Making every file in one step,
before the first ``up``, leaves no slot empty.

Each file is created owner-only (0600, ``O_EXCL``): an existing file is kept, never overwritten
(a new signing or operator key would orphan what the old one signed or wrapped), so running it
again after an upgrade adds only the files that are new. No value is printed: the API key is in
``api-keys.yaml``. Compose mounts the files as they are, so each must belong to the uid that
reads it (``--owners``, as root; else the ``chown`` it prints)."""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import shlex
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from crossaudit.cli.common import EXIT_OK
from crossaudit.evidence.notes import generate_private_pem, load_signing_key
from crossaudit.governance.vault import KEY_BYTES as OPERATOR_KEY_BYTES
from crossaudit.kernel.errors import InvalidInputError
from crossaudit.service.auth import TENANT_NAME

ORCHESTRATOR_UID = 10003  # the orchestrator image's user (images/orchestrator/Dockerfile)
POSTGRES_UID = 990  # the PostgreSQL image's user (deploy/postgres/Dockerfile)
API_KEY_BYTES = 24  # 48 hex digits: above the service's 16-character minimum many times over
PASSWORD_BYTES = 24
PRIVATE_MODE = 0o600
PUBLIC_MODE = 0o644
DIR_MODE = 0o700
DEFAULT_TENANT = "default"
DB_USER = DB_NAME = "crossaudit"  # deploy/compose.yaml's --store URL and POSTGRES_* settings
DB_HOST, DB_PORT = "postgres", 5432

API_KEYS = "api-keys.yaml"
PGPASS = "pgpass"
POSTGRES_PASSWORD = "postgres-password"
EVIDENCE_KEY = "evidence-signing.pem"
OPERATOR_KEY = "retention-operator.key"
EVIDENCE_PUBLIC = "evidence-public.pem"  # not a secret: the public key auditors verify with


@dataclass(frozen=True)
class SecretFile:
    name: str
    owner: int  # the uid that reads it in its container
    what: str


SECRET_FILES = (
    SecretFile(API_KEYS, ORCHESTRATOR_UID, "tenants and API keys (docs/service.md)"),
    SecretFile(PGPASS, ORCHESTRATOR_UID, "the replicas' PostgreSQL password (libpq passfile)"),
    SecretFile(POSTGRES_PASSWORD, POSTGRES_UID, "the same password, for the PostgreSQL container"),
    SecretFile(EVIDENCE_KEY, ORCHESTRATOR_UID, "evidence.signing_key_file: signs the decision logs"),
    SecretFile(OPERATOR_KEY, ORCHESTRATOR_UID, "retention.operator_key_file: wraps retained inputs' keys"),
)


def register(csub: argparse._SubParsersAction) -> None:
    s = csub.add_parser(
        "secrets",
        help="write the secret files a deployment mounts (API keys, database password, signing and operator keys)",
        description=(
            "Create in DIR, owner-only, each secret file deploy/compose.yaml and deploy/k8s mount that is not there "
            "yet: api-keys.yaml, pgpass and postgres-password (one random password), evidence-signing.pem "
            "(evidence.signing_key_file) and retention-operator.key (retention.operator_key_file); and "
            "evidence-public.pem, the public key to give auditors. Existing files are kept. No value is printed."
        ),
    )
    s.add_argument("dir", metavar="DIR", help="where to write them (deploy/secrets for deploy/compose.yaml)")
    s.add_argument("--tenant", default=DEFAULT_TENANT, help=f"the tenant of the API key (default {DEFAULT_TENANT})")
    s.add_argument(
        "--owners",
        action="store_true",
        help=f"chown each file to the uid that reads it ({ORCHESTRATOR_UID}: orchestrator, {POSTGRES_UID}: "
        "PostgreSQL), as compose needs; root only",
    )
    s.set_defaults(func=cmd_config_secrets)


def _create(path: Path, data: bytes, mode: int = PRIVATE_MODE) -> None:
    """``data`` into a new file ``path`` with ``mode`` whatever the umask; an existing one is an error."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError:
        raise InvalidInputError(f"{path} exists: a secret file is never overwritten") from None
    except OSError as exc:
        raise InvalidInputError(f"cannot create {path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), mode)
        f.write(data)


def _password_files(directory: Path) -> dict[str, bytes]:
    """pgpass and postgres-password hold one password: both new, or both kept."""
    there = [n for n in (PGPASS, POSTGRES_PASSWORD) if (directory / n).exists()]
    if len(there) == 1:
        (other,) = {PGPASS, POSTGRES_PASSWORD} - set(there)
        raise InvalidInputError(
            f"{directory / there[0]} exists without {directory / other}: both hold one password; write the other "
            "by hand (deploy/secrets/README.md), or remove the one there"
        )
    if there:
        return {}
    password = secrets.token_hex(PASSWORD_BYTES)
    return {
        PGPASS: f"{DB_HOST}:{DB_PORT}:{DB_NAME}:{DB_USER}:{password}\n".encode(),
        POSTGRES_PASSWORD: f"{password}\n".encode(),
    }


def _tenant(name: str) -> str:
    if not TENANT_NAME.match(name):
        raise InvalidInputError(f"--tenant {name!r}: not a tenant name ({TENANT_NAME.pattern})")
    return name


def write_secret_files(directory: Path, *, tenant: str = DEFAULT_TENANT) -> list[tuple[str, bool]]:
    """Create the files of :data:`SECRET_FILES` missing from ``directory`` (made 0700 when new);
    (name, written) for each, in order: False when it was there and is kept."""
    tenant = _tenant(tenant)
    try:
        directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(f"cannot create {directory}: {exc.strerror}") from None
    if not directory.is_dir():
        raise InvalidInputError(f"{directory} is not a directory")
    if directory.stat().st_mode & stat.S_IWOTH:  # another user could put their own key there first
        raise InvalidInputError(f"{directory} is writable by other users: choose a directory only you can write")
    makers: dict[str, Callable[[], bytes]] = {
        API_KEYS: lambda: f'tenants:\n  {tenant}:\n    keys: ["{secrets.token_hex(API_KEY_BYTES)}"]\n'.encode(),
        EVIDENCE_KEY: generate_private_pem,
        OPERATOR_KEY: lambda: base64.b64encode(secrets.token_bytes(OPERATOR_KEY_BYTES)) + b"\n",
    }
    passwords = _password_files(directory)
    done = []
    for f in SECRET_FILES:
        path = directory / f.name
        if path.exists() or path.is_symlink():
            done.append((f.name, False))
            continue
        data = passwords[f.name] if f.name in passwords else makers[f.name]()
        _create(path, data)
        if f.name == EVIDENCE_KEY and not (directory / EVIDENCE_PUBLIC).exists():
            public = load_signing_key(data, "crossaudit", str(path)).public.pem().encode()
            _create(directory / EVIDENCE_PUBLIC, public, PUBLIC_MODE)
        done.append((f.name, True))
    return done


def set_owners(directory: Path) -> None:
    """Each secret file to the uid (and gid) that reads it; compose mounts files as they are."""
    if os.geteuid() != 0:
        raise InvalidInputError("--owners changes files' owners: run it as root (or use the chown it prints)")
    for f in SECRET_FILES:
        try:
            os.chown(directory / f.name, f.owner, f.owner, follow_symlinks=False)
        except OSError as exc:
            raise InvalidInputError(f"cannot chown {directory / f.name}: {exc.strerror}") from None


def chown_hint(directory: Path) -> str:
    """The commands that give each file to its reader, one ``chown`` per uid."""
    by_owner: dict[int, list[str]] = {}
    for f in SECRET_FILES:
        by_owner.setdefault(f.owner, []).append(shlex.quote(str(directory / f.name)))
    return " && ".join(f"sudo chown {uid}:{uid} {' '.join(paths)}" for uid, paths in by_owner.items())


def cmd_config_secrets(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    what = {f.name: f.what for f in SECRET_FILES}
    for name, written in write_secret_files(directory, tenant=args.tenant):
        verb = "wrote" if written else "kept "
        print(f"{verb} {directory / name}: {what[name]}", file=sys.stderr)
    if (directory / EVIDENCE_PUBLIC).exists():
        print(f"the public key auditors verify with: {directory / EVIDENCE_PUBLIC}", file=sys.stderr)
    if args.owners:
        set_owners(directory)
    else:
        print(f"compose mounts them as they are; give each to its reader: {chown_hint(directory)}", file=sys.stderr)
    return EXIT_OK
