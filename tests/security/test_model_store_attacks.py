"""Attacks on the builtin-model surface: the model store, downloads into it, resolution, ONNX sidecars.

Every server here listens on 127.0.0.1 only. The store is the operator's (trusted), but what
arrives in it from the network (downloads, release archives) and what a tenant's policy can
steer (a builtin's config) are not: each test plays one of those against the store and checks
that nothing escapes the store, nothing half-written stays, limits hold, and one tenant's call
neither sees another's text nor names a host file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import ssl
import stat
import threading
import time
import warnings
import zipfile
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from crossaudit.kernel.builtins import DetoxifyConfig
from crossaudit.kernel.errors import ConfigurationError, InvalidInputError, PolicyValidationError
from crossaudit.kernel.results import Verdict
from crossaudit.modelserver import onnxfiles, sources
from crossaudit.modelserver.builtins import model_path_settings
from crossaudit.modelserver.builtins.detoxify import DetoxifyRuntime
from crossaudit.modelserver.download import DownloadError, download
from crossaudit.modelserver.store import MANIFEST, STAGING, ModelStore, ModelStoreLimits
from crossaudit.service.hosted import hosted_checks
from orchestrator.evaluators.builtin import PresidioEvaluator
from orchestrator.policy.validate import load_policy
from tests.http_files import file_server, serving

# --- helpers ------------------------------------------------------------------------------------------


def tree(root: Path) -> set[str]:
    """Every path under ``root`` (to show that nothing appeared outside the store)."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*")} if root.exists() else set()


def staged_leftovers(store: ModelStore) -> list[str]:
    """What a failed write left in the staging area (lock files are expected, entries are not)."""
    staging = store.root / STAGING
    return sorted(p.name for p in staging.iterdir() if not p.name.endswith(".lock")) if staging.exists() else []


@contextlib.contextmanager
def serve(handler: Callable[[BaseHTTPRequestHandler], None], tls: ssl.SSLContext | None = None) -> Iterator[dict]:
    """A loopback HTTP(S) server whose GETs run ``handler``; yields {"url", "requests"}."""
    state: dict = {"requests": [], "url": ""}

    class Handler(BaseHTTPRequestHandler):
        timeout = 30
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            state["requests"].append(self.path)
            with contextlib.suppress(OSError):
                handler(self)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler, tls) as url:
        state["url"] = url
        yield state


def redirect_to(target: str) -> Callable[[BaseHTTPRequestHandler], None]:
    def handler(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", target)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return handler


def loopback_tls(tmp_path: Path) -> tuple[ssl.SSLContext, Path]:
    """A self-signed certificate for 127.0.0.1: a server context and the CA file a client trusts."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_file, key_file)
    return ctx, cert_file


# --- 1. nothing leaves the store ----------------------------------------------------------------------

BAD_NAMES = ["../escape", "..", ".", "/abs", "a/b", "a\\b", ".hidden", "Upper", "x\x00y", "a..b", "", "é", "a" * 101]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_names_and_variants_with_path_characters_are_refused_by_every_operation(tmp_path: Path, bad: str) -> None:
    store = ModelStore(tmp_path / "data" / "store")
    src = tmp_path / "m.ckpt"
    src.write_bytes(b"model")
    before = tree(tmp_path)
    for attempt in (
        lambda: store.import_path(bad, src),
        lambda: store.import_path("ok", src, bad),
        lambda: store.get(bad),
        lambda: store.get("ok", bad),
        lambda: store.remove(bad),
        lambda: store.verify(bad),
        lambda: store.entry_dir("ok", bad),
        lambda: sources.pull(store, bad, url="http://127.0.0.1:9/m.ckpt", environ={}),
        *([lambda: sources.pull(store, "ok", bad, url="http://127.0.0.1:9/m.ckpt", environ={})] if bad else []),
    ):  # (pull's variant "" means the default one)
        with pytest.raises(InvalidInputError):
            attempt()
        with pytest.raises(InvalidInputError), store.entry_lock(bad):
            pass
    assert tree(tmp_path) - before <= {"data", "data/store", "data/store/.staging"}


@pytest.mark.parametrize("path", ["../../../outside", "/etc/passwd", "a/../../x", "", "./x", "a//b", ".."])
def test_a_manifest_naming_files_outside_its_entry_is_refused(tmp_path: Path, path: str) -> None:
    store = ModelStore(tmp_path / "store")
    src = tmp_path / "m.ckpt"
    src.write_bytes(b"model")
    entry = store.import_path("detoxify", src, "original")
    doc = json.loads((entry.directory / MANIFEST).read_text())
    doc["files"] = [{"path": path, "sha256": "0" * 64, "size": os.path.getsize("/etc/passwd")}]
    (entry.directory / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(ConfigurationError, match="unsafe path"):
        store.get("detoxify", "original")
    with pytest.raises(ConfigurationError):
        store.verify()


def test_manifest_bombs_are_typed_errors_that_quote_nothing_of_the_file(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store", ModelStoreLimits(max_manifest_bytes=1024 * 1024))
    src = tmp_path / "m.ckpt"
    src.write_bytes(b"model")
    manifest = store.import_path("detoxify", src, "original").directory / MANIFEST
    for body in (
        "[" * 200_000,  # nesting deeper than the parser's recursion limit
        '{"x": "SECRET-CONTENT-OF-THE-FILE", ',  # broken JSON: the error must not echo the file
        " " * (1024 * 1024 + 1),  # larger than the manifest cap: refused unread
        '{"name": "detoxify", "variant": "original", "source": "", "created": "", "files": [{"path": "m", '
        '"sha256": "0", "size": 1e999}]}',  # a size that does not fit an int
    ):
        manifest.write_text(body)
        with pytest.raises(ConfigurationError) as info:
            store.get("detoxify", "original")
        assert "SECRET-CONTENT" not in str(info.value)
        with pytest.raises(ConfigurationError):
            store.entries()


def test_import_refuses_special_files_and_links_and_never_shares_an_inode(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InvalidInputError, match="neither a regular file"):
        store.import_path("a", fifo)  # would block forever if it were opened
    outside = tmp_path / "secret.txt"
    outside.write_text("host secret")
    cases = {
        "fifo": lambda d: os.mkfifo(d / "pipe"),
        "file-link": lambda d: (d / "link").symlink_to(outside),
        "relative-link": lambda d: (d / "rel").symlink_to("../secret.txt"),
        "dir-link": lambda d: (d / "sub").symlink_to(tmp_path),
    }
    for label, plant in cases.items():
        d = tmp_path / f"src-{label}"
        d.mkdir()
        (d / "config.cfg").write_text("[nlp]\n")
        plant(d)
        with pytest.raises(InvalidInputError):
            store.import_path("b", d)
        assert store.get("b") is None
    # a hard link is copied as its bytes: the store never shares an inode with the source
    d = tmp_path / "src-hardlink"
    d.mkdir()
    os.link(outside, d / "hard")
    entry = store.import_path("c", d)
    stored = entry.path_of("hard")
    assert stored.stat().st_ino != outside.stat().st_ino and stored.stat().st_nlink == 1
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert staged_leftovers(store) == []


def _wheel(path: Path, package: str, members: list[tuple[zipfile.ZipInfo | str, bytes]]) -> bytes:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{package}/{package}-3.8.0/config.cfg", "[nlp]\n")
        for info, data in members:
            zf.writestr(info, data)
    return path.read_bytes()


def test_spacy_archive_members_cannot_escape_plant_links_or_collide(tmp_path: Path) -> None:
    pkg = "en_core_web_sm"
    prefix = f"{pkg}/{pkg}-3.8.0/"
    link = zipfile.ZipInfo(prefix + "ner/model")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16  # a symlink member whose target is /etc/passwd
    evil = {
        "absolute": [(prefix + "/etc/cron.d/x", b"x")],
        "dotdot": [(prefix + "a/../../../../escape", b"x")],
        "backslash": [(prefix + "..\\..\\escape", b"x")],
        "duplicate": [(prefix + "vocab", b"1"), (prefix + "vocab", b"2")],
        "file-then-dir": [(prefix + "vocab", b"1"), (prefix + "vocab/strings", b"2")],
    }
    store = ModelStore(tmp_path / "store")
    before = tree(tmp_path)
    with file_server() as srv:
        env = {"CROSSAUDIT_SPACY_MODELS_URL": srv.url, "CROSSAUDIT_SPACY_MODEL_VERSION": "3.8.0"}
        wheel_url = f"/{pkg}-3.8.0/{pkg}-3.8.0-py3-none-any.whl"
        for label, members in evil.items():
            with warnings.catch_warnings():  # zipfile warns when writing the duplicate: that is the point
                warnings.simplefilter("ignore", UserWarning)
                srv.add(wheel_url, _wheel(tmp_path / f"{label}.whl", pkg, members))
            with pytest.raises(DownloadError):
                sources.pull(store, pkg, environ=env)
            assert store.get(pkg) is None, label
            assert staged_leftovers(store) == [], label
        assert tree(tmp_path) - before - {f"{label}.whl" for label in evil} == {"store", "store/.staging",
                                                                              f"store/.staging/{pkg}--default.lock"}
        srv.add(wheel_url, _wheel(tmp_path / "link.whl", pkg, [(link, b"/etc/passwd")]))
        [entry] = sources.pull(store, pkg, environ=env)
    planted = entry.path_of("ner/model")
    assert not planted.is_symlink() and planted.read_bytes() == b"/etc/passwd"


def test_an_archive_bomb_stops_at_the_store_limits(tmp_path: Path) -> None:
    pkg = "en_core_web_sm"
    prefix = f"{pkg}/{pkg}-3.8.0/"
    mib = 1024 * 1024
    store = ModelStore(tmp_path / "store", ModelStoreLimits(max_file_bytes=mib, max_entry_bytes=3 * mib))
    many = [(prefix + f"part{i}", b"\0" * (1024 * 1024)) for i in range(4)]  # each fits, together too much
    with file_server() as srv:
        env = {"CROSSAUDIT_SPACY_MODELS_URL": srv.url, "CROSSAUDIT_SPACY_MODEL_VERSION": "3.8.0"}
        url = f"/{pkg}-3.8.0/{pkg}-3.8.0-py3-none-any.whl"
        for members in ([(prefix + "huge", b"\0" * (20 * 1024 * 1024))], many):
            body = _wheel(tmp_path / "bomb.whl", pkg, members)
            assert len(body) < 1024 * 1024  # small on the wire, large unpacked
            srv.add(url, body)
            with pytest.raises(DownloadError, match="larger than the store's limits"):
                sources.pull(store, pkg, environ=env)
            assert store.get(pkg) is None and staged_leftovers(store) == []


# --- 2. downloads ---------------------------------------------------------------------------------------


def test_a_trickling_server_cannot_outlast_the_download_timeout(tmp_path: Path) -> None:
    """One byte every 0.1 s never trips the read timeout; the whole-download deadline must still hold."""
    stop = threading.Event()

    def trickle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        for _ in range(1000):
            if stop.is_set():
                return
            h.wfile.write(b"x")
            h.wfile.flush()
            time.sleep(0.1)

    store = ModelStore(tmp_path / "store", ModelStoreLimits(download_timeout_s=1.0, download_read_timeout_s=5.0))
    with serve(trickle) as srv:
        try:  # the trickle would go on for 100 s: only the whole-download deadline ends it this way
            with pytest.raises(DownloadError, match="not finished within"):
                sources.pull(store, "slow", url=srv["url"] + "/m.bin", environ={})
        finally:
            stop.set()
    assert store.get("slow") is None and staged_leftovers(store) == []


def test_bodies_longer_than_declared_or_endless_are_capped(tmp_path: Path) -> None:
    def endless(h: BaseHTTPRequestHandler) -> None:  # no Content-Length: the body ends when the server closes
        h.send_response(200)
        h.send_header("Connection", "close")
        h.end_headers()
        for _ in range(10_000):
            h.wfile.write(b"y" * 4096)

    def liar(h: BaseHTTPRequestHandler) -> None:  # declares 10 bytes, sends 50,000
        h.send_response(200)
        h.send_header("Content-Length", "10")
        h.end_headers()
        h.wfile.write(b"z" * 50_000)

    def truncated(h: BaseHTTPRequestHandler) -> None:  # declares 1,000 bytes, sends 10 and hangs up
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(b"w" * 10)
        h.close_connection = True

    store = ModelStore(tmp_path / "store", ModelStoreLimits(max_file_bytes=1000))
    with serve(endless) as srv, pytest.raises(DownloadError, match="more than 1000 bytes"):
        sources.pull(store, "endless", url=srv["url"] + "/m.bin", environ={})
    with serve(truncated) as srv, pytest.raises(DownloadError):
        sources.pull(store, "truncated", url=srv["url"] + "/m.bin", environ={})
    assert store.entries() == [] and staged_leftovers(store) == []
    with serve(liar) as srv:
        [entry] = sources.pull(store, "liar", url=srv["url"] + "/m.bin", environ={})
    assert entry.size == 10 and entry.path_of("m.bin").read_bytes() == b"z" * 10


def test_redirects_to_other_schemes_and_redirect_loops_are_refused(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    for target in ("file:///etc/passwd", "ftp://127.0.0.1/m.bin", "gopher://127.0.0.1/x"):
        with serve(redirect_to(target)) as srv, pytest.raises(DownloadError):
            sources.pull(store, "redir", url=srv["url"] + "/m.bin", environ={})
    with serve(lambda h: redirect_to(f"/loop{len(h.path)}")(h)) as srv:
        with pytest.raises(DownloadError, match=r"TooManyRedirects|redirect"):
            sources.pull(store, "redir", url=srv["url"] + "/m.bin", environ={})
        assert len(srv["requests"]) == store.limits.max_redirects + 1
    assert store.entries() == [] and staged_leftovers(store) == []


def test_an_https_source_is_never_downgraded_to_http_by_a_redirect(tmp_path: Path, monkeypatch) -> None:
    """A redirect from an official https source to plain http would let anyone on the path replace a
    pickled checkpoint or a pipeline whose source publishes no hash; it must not even be requested."""
    ctx, ca = loopback_tls(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    store = ModelStore(tmp_path / "store")
    with file_server() as plain:
        plain.add("/m.bin", b"tampered bytes")
        with serve(redirect_to(plain.url + "/m.bin"), tls=ctx) as secure:
            with pytest.raises(DownloadError, match="https"):
                sources.pull(store, "down", url=secure["url"] + "/m.bin", environ={})
            assert secure["requests"] == ["/m.bin"]
        assert plain.requests == []
    with serve(lambda h: redirect_to("/final")(h) if h.path != "/final" else _ok(h, b"fine"), tls=ctx) as secure:
        [entry] = sources.pull(store, "same", url=secure["url"] + "/m.bin", environ={})  # https -> https is fine
    assert entry.path_of("m.bin").read_bytes() == b"fine"
    assert store.get("down") is None and staged_leftovers(store) == []


def _ok(h: BaseHTTPRequestHandler, body: bytes) -> None:
    h.send_response(200)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def test_a_hash_mismatch_leaves_no_half_written_entry(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    with file_server() as srv:
        env = {
            "CROSSAUDIT_DETOXIFY_URL_ORIGINAL": srv.add("/toxic_original-deadbeef.ckpt", b"not the published file"),
            "CROSSAUDIT_HF_ENDPOINT": srv.url,
        }
        with pytest.raises(DownloadError, match="does not match the SHA-256 prefix"):
            sources.pull(store, "detoxify", environ=env)
        srv.add("/bert-base-uncased/resolve/main/config.json", b"{}", x_linked_etag='"' + "a" * 64 + '"')
        srv.add("/bert-base-uncased/resolve/main/vocab.txt", b"[PAD]\n")
        with pytest.raises(DownloadError, match="X-Linked-Etag"):
            sources.pull(store, "bert-base-uncased", environ=env)
    assert store.entries() == [] and staged_leftovers(store) == []
    assert tree(store.root) <= {".staging", ".staging/detoxify--original.lock",
                                ".staging/bert-base-uncased--default.lock"}
    dest = tmp_path / "direct.bin"
    with file_server() as srv, pytest.raises(DownloadError):
        download(srv.add("/x.bin", b"abc"), dest, expected_sha256="0" * 64)
    assert not dest.exists()


def test_concurrent_pulls_of_one_entry_download_it_once(tmp_path: Path) -> None:
    body = b"checkpoint" * 1000

    def slow(h: BaseHTTPRequestHandler) -> None:
        time.sleep(0.3)
        _ok(h, body)

    results: list[object] = []
    with serve(slow) as srv:
        url = srv["url"] + "/m.ckpt"

        def pull() -> None:
            try:
                results.append(sources.pull(ModelStore(tmp_path / "store"), "same", url=url, environ={})[0])
            except Exception as exc:  # collected, so the assertion below names it
                results.append(exc)

        threads = [threading.Thread(target=pull) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert len(srv["requests"]) == 1
    assert all(not isinstance(r, Exception) for r in results), results
    assert len({r.created for r in results}) == 1 and len(results) == 6
    [entry] = ModelStore(tmp_path / "store").entries()
    assert entry.path_of("m.ckpt").read_bytes() == body and staged_leftovers(ModelStore(tmp_path / "store")) == []


# --- 3. what a tenant's policy can steer ------------------------------------------------------------


def _policy(config: str, type_line: str = "    type: builtin\n") -> str:
    return (
        'name: p\ndescription: d\nversion: "1.0"\nevaluators:\n  - name: e\n' + type_line
        + f"    config: {config}\nrules:\n  - {{name: r, evaluator: e}}\n"
    )


@pytest.mark.parametrize("field", sorted(model_path_settings()))
@pytest.mark.parametrize("value", ['"/etc/passwd"', "null", '""', '"${MODEL}"', '"rel/x"'])
@pytest.mark.parametrize("model", ["detoxify", "presidio", "langdetect"])
def test_the_service_refuses_every_model_path_field_however_written(field: str, value: str, model: str) -> None:
    checks = [hosted_checks(None)]
    for type_line in ("    type: builtin\n", ""):  # explicit, and inferred from config.model
        text = _policy(f"{{model: {model}, {field}: {value}}}", type_line)
        with pytest.raises(PolicyValidationError) as info:
            load_policy(text, env={"MODEL": "/etc/passwd"}, checks=checks)
        assert f"evaluators[0].config.{field}" in str(info.value)
        assert "passwd" not in str(info.value).replace(value, "")


def test_a_tenants_language_cannot_name_a_store_path(tmp_path: Path) -> None:
    env = {"CROSSAUDIT_MODEL_STORE": str(tmp_path / "store"), "CROSSAUDIT_OFFLINE": "1"}
    for language in ("../../etc", "/tmp", "en/../..", "..", "a\\b"):
        ev = PresidioEvaluator("e", {"model": "presidio", "language": language}, environ=env)
        with pytest.raises(InvalidInputError):
            ev.resolved_config()
    assert tree(tmp_path) <= {"store", "store/.staging"}


def test_a_failed_call_time_download_is_not_retried_on_every_call(tmp_path: Path) -> None:
    """A tenant picks the language, hence the spaCy package: one with no release (404) must not make
    the server send an outbound request on every one of the tenant's calls."""
    with file_server() as srv:
        env = {
            "CROSSAUDIT_MODEL_STORE": str(tmp_path / "store"),
            "CROSSAUDIT_SPACY_MODELS_URL": srv.url,
            "CROSSAUDIT_SPACY_MODEL_VERSION": "3.8.0",
            "CROSSAUDIT_SPACY_DOWNLOAD_LANGUAGES": "en,qq",  # the operator lets calls fetch qq
        }
        ev = PresidioEvaluator("e", {"model": "presidio", "language": "qq", "entities": ["PERSON"]}, environ=env)
        for _ in range(5):
            with pytest.raises(ConfigurationError, match="HTTP 404"):
                ev.resolved_config()
        assert len(srv.requests) == 1, srv.requests
        # `crossaudit models pull` (the operator) still retries at once
        with pytest.raises(DownloadError, match="HTTP 404"):
            sources.pull(ModelStore(tmp_path / "store"), "qq_core_news_lg", environ=env)
        assert len(srv.requests) == 2


def test_a_tenants_language_downloads_only_what_the_operator_allows(tmp_path: Path) -> None:
    """By default a call may fetch the English pipeline only: a policy naming other languages
    cannot make the server download each language's ~500 MB release."""
    with file_server() as srv:
        env = {
            "CROSSAUDIT_MODEL_STORE": str(tmp_path / "store"),
            "CROSSAUDIT_SPACY_MODELS_URL": srv.url,
            "CROSSAUDIT_SPACY_MODEL_VERSION": "3.8.0",
        }
        for language in ("de", "fr", "es", "zh"):
            ev = PresidioEvaluator(
                "e", {"model": "presidio", "language": language, "entities": ["PERSON"]}, environ=env
            )
            with pytest.raises(ConfigurationError, match="CROSSAUDIT_SPACY_DOWNLOAD_LANGUAGES"):
                ev.resolved_config()
        assert srv.requests == []
        ev = PresidioEvaluator("e", {"model": "presidio", "language": "en", "entities": ["PERSON"]}, environ=env)
        with pytest.raises(ConfigurationError, match="HTTP 404"):  # English is fetched (here: no release)
            ev.resolved_config()
        assert len(srv.requests) == 1


# --- 4. ONNX export sidecars ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        "[" * 60_000,  # deeper than the JSON parser's recursion limit, well under the size cap
        " " * (onnxfiles.MAX_SIDECAR_BYTES + 1),
        json.dumps({"format": 1, "labels": ["toxicity"], "max_length": 1e999, "inputs": ["input_ids"]}),
        json.dumps({"format": 1, "labels": ["toxicity"], "max_length": 0, "inputs": ["input_ids"]}),
        json.dumps({"format": 1, "labels": ["toxicity"], "max_length": -5, "inputs": ["input_ids"]}),
        json.dumps({"format": 1, "labels": ["toxicity"], "max_length": 128, "inputs": ["input_ids"], "pad_id": 1e999}),
        json.dumps({"format": 1, "labels": [f"l{i}" for i in range(65)], "max_length": 128, "inputs": []}),
        json.dumps({"format": 1, "labels": ["t"], "max_length": 128, "inputs": [], "files": {"fp32": "../../x"}}),
        json.dumps({"format": 1, "labels": ["t"], "max_length": 128, "inputs": [], "files": {"fp32": "/etc/passwd"}}),
    ],
)
def test_malicious_sidecars_are_configuration_errors(tmp_path: Path, body: str) -> None:
    (tmp_path / onnxfiles.SIDECAR_FILE).write_text(body)
    with pytest.raises(ConfigurationError, match="detoxify:"):
        onnxfiles.read_sidecar(tmp_path)


# --- 5. one tenant's call never sees another's -------------------------------------------------------


class _FakeModel:
    """Scores a text by its length; breaks on a batch holding "BOOM", quoting every text it got
    (as a tokenizer or graph error might), and on "BOOM" alone quoting that text."""

    precision = None
    labels = ("toxicity",)

    def predict(self, texts: list[str]) -> list[dict[str, float]]:
        if any("BOOM" in t for t in texts):
            raise ValueError(f"cannot score {texts!r}")
        return [{"toxicity": min(1.0, len(t) / 100)} for t in texts]


def test_a_batch_mates_failure_never_carries_another_tenants_text() -> None:
    runtime = DetoxifyRuntime()
    cfg = DetoxifyConfig(model="detoxify", checkpoint="/models/x.ckpt", huggingface_config_path="/models/hf")
    runtime._models[runtime._key(cfg)] = _FakeModel()
    wire = cfg.model_dump(mode="json", exclude_none=True)
    out = runtime.analyze_batch([
        (wire, "", "tenant A private text"),
        (wire, "", "BOOM from tenant B"),
        (wire, "", "tenant C"),
    ])
    assert isinstance(out[0], Verdict) and out[0].details["categories"]["toxicity"] == pytest.approx(0.21)
    assert isinstance(out[2], Verdict) and out[2].details["categories"]["toxicity"] == pytest.approx(0.08)
    assert isinstance(out[1], ValueError)
    assert "tenant A" not in str(out[1]) and "tenant C" not in str(out[1])
    assert all("tenant" not in json.dumps(v.details) for v in (out[0], out[2]))


@pytest.mark.parametrize("case", ["linked-file", "linked-directory", "nul-path", "other-name", "linked-entry"])
def test_the_load_path_refuses_links_out_of_an_entry_and_foreign_manifests(tmp_path: Path, case: str) -> None:
    """``get`` (what the model servers load) checked only each file's size, following links:
    a checkpoint linked to a file outside the entry (directly, or through a linked directory)
    loaded that file although import, pull and verify all refuse links; a NUL in a manifest path
    was an untyped ValueError; an entry whose manifest names another model was served as asked."""
    store = ModelStore(tmp_path / "store")
    src = tmp_path / "m.ckpt"
    src.write_bytes(b"model")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "m.ckpt").write_bytes(b"OUTSIDE!")
    entry = store.import_path("detoxify", src, "original")
    doc = json.loads((entry.directory / MANIFEST).read_text())
    (entry.files_dir / "m.ckpt").unlink()
    if case == "linked-file":
        (entry.files_dir / "m.ckpt").symlink_to(outside / "m.ckpt")
        doc["files"] = [{"path": "m.ckpt", "sha256": "0" * 64, "size": 8}]
    elif case == "linked-directory":
        (entry.files_dir / "sub").symlink_to(outside)
        doc["files"] = [{"path": "sub/m.ckpt", "sha256": "0" * 64, "size": 8}]
    elif case == "nul-path":
        doc["files"] = [{"path": "m\x00.ckpt", "sha256": "0" * 64, "size": 5}]
    elif case == "other-name":
        (entry.files_dir / "m.ckpt").write_bytes(b"model")
        doc["name"] = "presidio"
    (entry.directory / MANIFEST).write_text(json.dumps(doc))
    if case == "linked-entry":  # a whole entry elsewhere, linked in as a variant
        (entry.files_dir / "m.ckpt").write_bytes(b"model")
        elsewhere = tmp_path / "elsewhere"
        entry.directory.rename(elsewhere)
        entry.directory.symlink_to(elsewhere)
        assert store.entries() == []
    with pytest.raises(ConfigurationError):
        store.get("detoxify", "original")


@pytest.mark.parametrize("lie", [False, True])
def test_an_archive_index_bomb_is_refused_before_its_index_is_read(tmp_path: Path, lie: bool) -> None:
    """The member count was checked only after zipfile had read and parsed the whole central
    directory (a 4 GiB wheel of empty members is tens of millions of parsed entries). Now the end
    record's member count and index size are checked first; an end record that understates the
    count is caught by the index size."""
    import tracemalloc

    wheel = tmp_path / "many.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for i in range(20_000):
            zf.writestr(f"x{i}", b"")
    if lie:  # the end of central directory record (the last 22 bytes): entries on this disk, in all
        body = bytearray(wheel.read_bytes())
        body[-22 + 8 : -22 + 12] = (5).to_bytes(2, "little") * 2
        wheel.write_bytes(bytes(body))
    store = ModelStore(
        tmp_path / "store", ModelStoreLimits(max_archive_members=10, max_archive_index_bytes=64 * 1024)
    )
    dest = tmp_path / "dest"
    dest.mkdir()
    tracemalloc.start()
    try:
        with pytest.raises(DownloadError, match=r"members|member index"):
            sources.extract_spacy_pipeline(wheel, "en_core_web_sm", dest, store)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024, f"{peak} bytes allocated: the index was read"
