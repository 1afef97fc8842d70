"""The model store (crossaudit/modelserver/store.py), pulls into it and `crossaudit models`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import stat
import zipfile
from pathlib import Path

import pytest

from crossaudit.cli.main import main
from crossaudit.kernel.errors import ConfigurationError, InvalidInputError
from crossaudit.modelserver import sources
from crossaudit.modelserver.download import DownloadError
from crossaudit.modelserver.store import (
    DEFAULT_DATA_DIR,
    STAGING,
    ModelStore,
    ModelStoreLimits,
    store_root,
    validate_name,
)
from crossaudit.service.config import ServerConfig
from tests.http_files import file_server


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _online(tmp_path: Path, **more: str) -> dict[str, str]:
    return {"CROSSAUDIT_MODEL_STORE": str(tmp_path / "store"), **more}


def test_default_store_is_under_the_services_default_data_dir() -> None:
    assert ServerConfig().data_dir == Path(DEFAULT_DATA_DIR)
    assert store_root({}) == Path(os.path.abspath(Path(DEFAULT_DATA_DIR) / "models"))
    assert store_root({"CROSSAUDIT_MODEL_STORE": "rel/store"}) == Path(os.path.abspath("rel/store"))


def test_import_file_and_directory_write_manifests_privately(tmp_path: Path) -> None:
    os.umask(0o022)
    ckpt = tmp_path / "tiny.ckpt"
    ckpt.write_bytes(b"checkpoint bytes")
    pipe = tmp_path / "pipe"
    (pipe / "ner").mkdir(parents=True)
    (pipe / "config.cfg").write_text("[nlp]\n")
    (pipe / "ner" / "model").write_bytes(b"\x00" * 100)
    store = ModelStore(tmp_path / "data" / "models")

    e = store.import_path("detoxify", ckpt, "original")
    assert e.single_file() == e.files_dir / "tiny.ckpt" and e.source == "import:tiny.ckpt"
    manifest = json.loads((e.directory / "manifest.json").read_text())
    assert manifest["name"] == "detoxify" and manifest["variant"] == "original" and manifest["created"].endswith("Z")
    assert manifest["files"] == [
        {"path": "tiny.ckpt", "sha256": hashlib.sha256(b"checkpoint bytes").hexdigest(), "size": 16}
    ]
    d = store.import_path("en_core_web_sm", pipe)
    assert sorted(f.path for f in d.files) == ["config.cfg", "ner/model"] and d.size == 106
    assert d.variant == "default" and d.source == "import:pipe"

    for p in [store.root, *store.root.rglob("*")]:
        if STAGING in p.parts:
            continue
        assert _mode(p) == (0o700 if p.is_dir() else 0o600), p
    assert _mode(tmp_path / "data") == 0o700  # parents created by the store too
    assert [(x.name, x.variant) for x in store.entries()] == [("detoxify", "original"), ("en_core_web_sm", "default")]
    assert list((store.root / STAGING).glob("entry-*")) == []  # nothing left behind

    with pytest.raises(InvalidInputError, match="already in store"):
        store.import_path("detoxify", ckpt, "original")
    ckpt.write_bytes(b"new checkpoint")
    assert store.import_path("detoxify", ckpt, "original", replace=True).size == 14
    assert store.get("detoxify", "original").files[0].sha256 == hashlib.sha256(b"new checkpoint").hexdigest()


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", ".", "", "Upper", "-lead", "a..b", "x\x00", "/abs"])
def test_names_with_traversal_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InvalidInputError):
        validate_name(bad)
    f = tmp_path / "f"
    f.write_bytes(b"x")
    store = ModelStore(tmp_path / "store")
    with pytest.raises(InvalidInputError):
        store.import_path(bad, f)
    with pytest.raises(InvalidInputError):
        store.import_path("ok", f, bad)
    assert not any(p for p in tmp_path.rglob("*") if p.name not in ("f",) and STAGING not in p.parts
                   and p != store.root and p.parent != store.root / STAGING)


def test_symlinks_in_an_import_and_unsafe_manifest_paths_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("not a model")
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "config.cfg").write_text("x")
    (pipe / "link").symlink_to(secret)
    store = ModelStore(tmp_path / "store")
    with pytest.raises(InvalidInputError, match="symbolic link"):
        store.import_path("en_core_web_sm", pipe)
    assert store.get("en_core_web_sm") is None

    # a manifest edited to point outside the entry is unreadable, not followed
    (pipe / "link").unlink()
    e = store.import_path("en_core_web_sm", pipe)
    doc = json.loads((e.directory / "manifest.json").read_text())
    doc["files"][0]["path"] = "../../../secret"
    (e.directory / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigurationError, match="unsafe path"):
        store.get("en_core_web_sm")


def test_a_failed_write_leaves_no_entry(tmp_path: Path) -> None:
    big = tmp_path / "pipe"
    big.mkdir()
    for i in range(3):
        (big / f"f{i}").write_bytes(b"x" * 10)
    store = ModelStore(tmp_path / "store", ModelStoreLimits(max_entry_files=2))
    with pytest.raises(InvalidInputError, match="more than 2 files"):
        store.import_path("m", big)
    small = ModelStore(tmp_path / "store", ModelStoreLimits(max_file_bytes=5))
    with pytest.raises(InvalidInputError, match="more than the store's limit"):
        small.import_path("m", big / "f0")
    assert store.get("m") is None and not (store.root / "m" / "default").exists()
    assert list((store.root / STAGING).glob("entry-*")) == []
    # replacing keeps the old entry when the new one cannot be written
    ok = store.import_path("m", big / "f0")
    with pytest.raises(InvalidInputError):
        small.import_path("m", big / "f1", replace=True)
    assert store.get("m") == ok


def test_verify_detects_modified_missing_and_extra_files(tmp_path: Path, capsys) -> None:
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "config.cfg").write_text("[nlp]\n")
    (pipe / "weights").write_bytes(b"w" * 64)
    root = tmp_path / "store"
    store = ModelStore(root)
    store.import_path("en_core_web_sm", pipe)
    store.import_path("other", pipe / "weights")
    assert store.verify()[1] == []
    assert main(["models", "verify", "--store", str(root)]) == 0

    weights = store.get("en_core_web_sm").files_dir / "weights"
    weights.write_bytes(b"W" + b"w" * 63)  # same size, other bytes
    checked, problems = store.verify()
    assert len(checked) == 2
    assert [(p.name, p.path, p.problem) for p in problems] == [
        ("en_core_web_sm", "weights", "sha256 differs from the manifest")
    ]
    (weights.parent / "extra").write_bytes(b"?")
    (weights.parent / "config.cfg").unlink()
    problems = {(p.path, p.problem) for p in store.verify("en_core_web_sm")[1]}
    assert problems == {("weights", "sha256 differs from the manifest"), ("config.cfg", "missing"),
                        ("extra", "not in the manifest")}
    capsys.readouterr()
    assert main(["models", "verify", "--store", str(root), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["checked"] == ["en_core_web_sm/default", "other/default"] and len(doc["mismatches"]) == 3
    assert main(["models", "verify", "other", "--store", str(root)]) == 0
    assert main(["models", "verify", "nothing", "--store", str(root)]) == 1  # NotFoundError: one line, exit 1
    # a damaged entry is an error for resolution too, not a silent fall-through to a download
    with pytest.raises(ConfigurationError, match="damaged"):
        store.get("en_core_web_sm")


def test_cli_import_list_and_pull_with_a_url(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("CROSSAUDIT_OFFLINE", raising=False)
    root = str(tmp_path / "store")
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"abc")
    assert main(["models", "import", "detoxify", str(ckpt), "--store", root]) == 0
    assert main(["models", "import", "detoxify", str(ckpt), "--variant", "huge", "--store", root]) == 1
    assert main(["models", "import", "x", str(tmp_path / "missing"), "--store", root]) == 1
    payload = os.urandom(3000)
    with file_server() as srv:
        url = srv.add("/files/custom.bin", payload)
        assert main(["models", "pull", "custom", "--url", url, "--store", root]) == 0
        assert main(["models", "pull", "nothing-known", "--store", root]) == 1  # needs --url
        monkeypatch.setenv("CROSSAUDIT_OFFLINE", "1")
        assert main(["models", "pull", "custom", "--url", url, "--store", root, "--force"]) == 1
        assert srv.requests == ["/files/custom.bin"]
    err = capsys.readouterr().err
    assert "offline mode is on (CROSSAUDIT_OFFLINE=1)" in err and "no official source is known" in err
    assert main(["models", "list", "--store", root]) == 0
    out = capsys.readouterr().out
    assert re.search(r"detoxify\s*│\s*original", out) and "custom" in out and url in out
    assert main(["models", "list", "--json", "--store", root]) == 0
    doc = json.loads(capsys.readouterr().out)
    custom = next(m for m in doc["models"] if m["name"] == "custom")
    assert custom["source"] == url and custom["files"][0]["sha256"] == hashlib.sha256(payload).hexdigest()


def test_pull_detoxify_checks_the_published_hash_and_fetches_the_base_config(tmp_path: Path) -> None:
    good = b"a detoxify checkpoint"
    prefix = hashlib.sha256(good).hexdigest()[:8]
    store = ModelStore(tmp_path / "store")
    with file_server() as srv:
        for name, data in (("config.json", b"{}"), ("vocab.txt", b"[PAD]\n"), ("tokenizer_config.json", b"{}")):
            srv.add(f"/bert-base-uncased/resolve/main/{name}", data)
        # the official file name carries a SHA-256 prefix: other bytes under it are refused
        srv.add("/v0.1-alpha/toxic_original-c1212f89.ckpt", good)
        env = _online(tmp_path, CROSSAUDIT_DETOXIFY_URL=srv.url + "/", CROSSAUDIT_HF_ENDPOINT=srv.url)
        with pytest.raises(DownloadError, match="does not match the SHA-256 prefix in its file name"):
            sources.pull(store, "detoxify", environ=env)
        assert store.get("detoxify", "original") is None

        url = srv.add(f"/mirror/toxic_original-{prefix}.ckpt", good)
        env["CROSSAUDIT_DETOXIFY_URL_ORIGINAL"] = url
        ck, base = sources.pull(store, "detoxify", environ=env)
        assert ck.name == "detoxify" and ck.source == url and ck.extra["verified_against"]
        assert base.name == "bert-base-uncased" and sorted(f.path for f in base.files) == [
            "config.json", "tokenizer_config.json", "vocab.txt"]  # the optional files the hub lacks: skipped
        n = len(srv.requests)
        sources.pull(store, "detoxify", environ=env)  # already there: no request
        assert len(srv.requests) == n
        # a published X-Linked-Etag (a hub LFS file's SHA-256) is checked too
        srv.add("/lfs.bin", b"lfs", X_Linked_Etag='"' + "0" * 64 + '"')
        with pytest.raises(DownloadError, match="X-Linked-Etag"):
            sources.pull(store, "lfs", url=srv.url + "/lfs.bin", environ=env)


def test_pull_spacy_unpacks_only_the_pipeline_from_the_release_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("en_core_web_sm/__init__.py", "")
        zf.writestr("en_core_web_sm/meta.json", "{}")
        zf.writestr("en_core_web_sm/en_core_web_sm-3.8.0/config.cfg", "[nlp]\n")
        zf.writestr("en_core_web_sm/en_core_web_sm-3.8.0/ner/model", b"\x01" * 10)
        zf.writestr("en_core_web_sm-3.8.0.dist-info/METADATA", "x")
    evil = tmp_path / "evil.whl"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("en_core_web_md/en_core_web_md-3.8.0/config.cfg", "x")
        zf.writestr("en_core_web_md/en_core_web_md-3.8.0/../../../escape", "x")
    store = ModelStore(tmp_path / "store")
    with file_server() as srv:
        srv.add("/en_core_web_sm-3.8.0/en_core_web_sm-3.8.0-py3-none-any.whl", wheel.read_bytes())
        srv.add("/en_core_web_md-3.8.0/en_core_web_md-3.8.0-py3-none-any.whl", evil.read_bytes())
        env = _online(tmp_path, CROSSAUDIT_SPACY_MODELS_URL=srv.url, CROSSAUDIT_SPACY_MODEL_VERSION="3.8.0")
        [entry] = sources.pull(store, "en_core_web_sm", environ=env)
        with pytest.raises(DownloadError, match="unsafe member"):
            sources.pull(store, "en_core_web_md", environ=env)
    assert sorted(f.path for f in entry.files) == ["config.cfg", "ner/model"]
    assert entry.extra["pipeline"] == "en_core_web_sm-3.8.0" and entry.source.endswith("-py3-none-any.whl")
    assert store.get("en_core_web_md") is None and not (tmp_path / "escape").exists()


def test_download_limits_hold(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store", ModelStoreLimits(max_file_bytes=100))
    with file_server() as srv:
        url = srv.add("/big.bin", b"x" * 101)
        with pytest.raises(DownloadError, match="more than the limit of 100"):
            sources.pull(store, "big", url=url, environ={})
        with pytest.raises(DownloadError, match="HTTP 404"):
            sources.pull(store, "big", url=srv.url + "/none.bin", environ={})
    with pytest.raises(DownloadError, match="only http"):
        sources.pull(store, "big", url="file:///etc/passwd", environ={})
    assert store.entries() == []


def _closed_port() -> int:
    """A loopback port with nothing listening (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_pull_from_an_unreachable_source_names_the_import_and_offline_mode(tmp_path: Path, capsys,
                                                                              monkeypatch) -> None:  # fmt: skip
    """Issue 19: ``models pull`` where the source cannot be reached said only "ConnectError"."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("CROSSAUDIT_OFFLINE", raising=False)
    nowhere = f"http://127.0.0.1:{_closed_port()}"
    root = str(tmp_path / "store")
    monkeypatch.setenv("CROSSAUDIT_DETOXIFY_URL", nowhere + "/")
    assert main(["models", "pull", "detoxify", "--variant", "unbiased", "--store", root]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    first, *fixes = err.splitlines()[-4:]
    assert first.startswith(f"error: downloading {nowhere}/") and "ConnectError" in first
    assert fixes[0] == "To fix it:"
    assert fixes[1] == (
        f"  - add a local copy instead: `crossaudit models import detoxify PATH --variant unbiased --store {root}` "
        "(PATH: a checkpoint file, or a directory with the checkpoint and its Hugging Face config/tokenizer in hf/), "
        "copied from a machine that has the model"
    )
    assert fixes[2].startswith("  - where the model's source cannot be reached, set CROSSAUDIT_OFFLINE=1 (offline")
    assert ModelStore(root).get("detoxify", "unbiased") is None

    # the checkpoint arrives, its base model's config does not: the import named is the base model's
    good = b"a detoxify checkpoint"
    with file_server() as srv:
        url = srv.add(f"/toxic_original-{hashlib.sha256(good).hexdigest()[:8]}.ckpt", good)
        monkeypatch.setenv("CROSSAUDIT_DETOXIFY_URL_ORIGINAL", url)
        monkeypatch.setenv("CROSSAUDIT_HF_ENDPOINT", nowhere)
        assert main(["models", "pull", "detoxify", "--store", root]) == 1
    err = capsys.readouterr().err
    assert f"`crossaudit models import bert-base-uncased PATH --store {root}` (PATH: a directory with" in err
    assert "CROSSAUDIT_OFFLINE=1" in err

    monkeypatch.setenv("CROSSAUDIT_OFFLINE", "1")  # refused before any download, with the same import
    assert main(["models", "pull", "en_core_web_sm", "--store", root]) == 1
    assert "`crossaudit models import en_core_web_sm PATH --store " in capsys.readouterr().err
