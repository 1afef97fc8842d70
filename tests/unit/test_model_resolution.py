"""The resolution order of the builtins' models (crossaudit/modelserver/locate.py), step by step.

Each test builds the places in a temporary directory (a model store, a torch hub cache, a
Hugging Face hub cache, an installed spaCy package on sys.path) and a real HTTP server for the
official sources, then checks which one wins and what the error says when none has the model.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from crossaudit.kernel.builtins import DetoxifyConfig, PresidioConfig
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.modelserver.builtins import model_problem, resolve_paths
from crossaudit.modelserver.builtins.base import ModelRequiredError
from crossaudit.modelserver.store import ModelStore
from tests.http_files import FileServer, file_server

CKPT = b"checkpoint of the original variant"
HF_FILES = {"config.json": b"{}", "vocab.txt": b"[PAD]\n"}
NETWORK_CLAIM = re.compile(r"unreachable|not reachable|no network|offline machine", re.I)


def detox(**cfg: object) -> DetoxifyConfig:
    return DetoxifyConfig(model="detoxify", **cfg)


def presidio(*entities: str) -> PresidioConfig:
    return PresidioConfig(model="presidio", entities=entities or ("PERSON", "EMAIL"))


@pytest.fixture
def places(tmp_path: Path) -> dict[str, str]:
    """Settings pointing every place at empty temporary directories; downloads go nowhere."""
    return {
        "CROSSAUDIT_MODEL_STORE": str(tmp_path / "store"),
        "TORCH_HOME": str(tmp_path / "torch"),
        "HF_HOME": str(tmp_path / "hf"),
        "CROSSAUDIT_SPACY_PACKAGE": "xx_crossaudit_test_sm",
        "CROSSAUDIT_SPACY_MODEL_VERSION": "3.8.0",
        "CROSSAUDIT_DETOXIFY_URL": "http://127.0.0.1:9/",  # overridden by tests that serve files
        "CROSSAUDIT_HF_ENDPOINT": "http://127.0.0.1:9",
        "CROSSAUDIT_SPACY_MODELS_URL": "http://127.0.0.1:9",
    }


@pytest.fixture
def server():
    with file_server() as srv:
        yield srv


def serve_detoxify(srv: FileServer, env: dict[str, str]) -> None:
    prefix = hashlib.sha256(CKPT).hexdigest()[:8]
    env["CROSSAUDIT_DETOXIFY_URL_ORIGINAL"] = srv.add(f"/releases/toxic_original-{prefix}.ckpt", CKPT)
    env["CROSSAUDIT_HF_ENDPOINT"] = srv.url
    for name, data in HF_FILES.items():
        srv.add(f"/bert-base-uncased/resolve/main/{name}", data)


def torch_cache(tmp_path: Path) -> Path:
    p = tmp_path / "torch" / "hub" / "checkpoints" / "toxic_original-c1212f89.ckpt"
    p.parent.mkdir(parents=True)
    p.write_bytes(b"cached")
    return p


def hf_cache(tmp_path: Path, repo: str = "models--google-bert--bert-base-uncased") -> Path:
    base = tmp_path / "hf" / "hub" / repo
    snap = base / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for name, data in HF_FILES.items():
        (snap / name).write_bytes(data)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text("abc123")
    return snap


def store_detoxify(tmp_path: Path, env: dict[str, str], *, with_hf: bool) -> Path:
    src = tmp_path / "imported"
    (src / "hf").mkdir(parents=True)
    (src / "mine.ckpt").write_bytes(b"stored")
    if with_hf:
        for name, data in HF_FILES.items():
            (src / "hf" / name).write_bytes(data)
    else:
        (src / "hf").rmdir()
    return ModelStore(env["CROSSAUDIT_MODEL_STORE"]).import_path("detoxify", src, "original").files_dir


# --- detoxify -----------------------------------------------------------------------------------


def test_detoxify_explicit_path_wins_over_everything(tmp_path, places, server) -> None:
    serve_detoxify(server, places)
    store_detoxify(tmp_path, places, with_hf=True)
    torch_cache(tmp_path)
    out = resolve_paths(detox(checkpoint="/m/x.ckpt", huggingface_config_path="/m/hf"), places)
    assert (out.checkpoint, out.huggingface_config_path) == ("/m/x.ckpt", "/m/hf")
    env = places | {"CROSSAUDIT_DETOXIFY_CHECKPOINT": "/e/x.ckpt", "CROSSAUDIT_DETOXIFY_CONFIG": "/e/hf"}
    out = resolve_paths(detox(), env)
    assert (out.checkpoint, out.huggingface_config_path) == ("/e/x.ckpt", "/e/hf")
    assert server.requests == []


def test_detoxify_store_wins_over_caches_and_download(tmp_path, places, server) -> None:
    serve_detoxify(server, places)
    files = store_detoxify(tmp_path, places, with_hf=True)
    torch_cache(tmp_path)
    hf_cache(tmp_path)
    out = resolve_paths(detox(), places)
    assert out.checkpoint == str(files / "mine.ckpt") and out.huggingface_config_path == str(files / "hf")
    assert server.requests == []
    # an explicit checkpoint still takes its config from the store
    out = resolve_paths(detox(checkpoint="/m/x.ckpt"), places)
    assert out.huggingface_config_path == str(files / "hf")


def test_detoxify_library_caches_win_over_download(tmp_path, places, server) -> None:
    serve_detoxify(server, places)
    cached = torch_cache(tmp_path)
    snap = hf_cache(tmp_path)
    out = resolve_paths(detox(), places)
    assert (out.checkpoint, out.huggingface_config_path) == (str(cached), str(snap))
    # a store entry with only the checkpoint: the config comes from the hub cache
    files = store_detoxify(tmp_path, places, with_hf=False)
    out = resolve_paths(detox(), places)
    assert (out.checkpoint, out.huggingface_config_path) == (str(files / "mine.ckpt"), str(snap))
    assert server.requests == []


def test_detoxify_downloads_into_the_store_once(tmp_path, places, server) -> None:
    serve_detoxify(server, places)
    out = resolve_paths(detox(), places)
    store = ModelStore(places["CROSSAUDIT_MODEL_STORE"])
    ck, base = store.get("detoxify", "original"), store.get("bert-base-uncased")
    assert out.checkpoint == str(ck.single_file()) and Path(out.checkpoint).read_bytes() == CKPT
    assert out.huggingface_config_path == str(base.files_dir)
    assert ck.source == places["CROSSAUDIT_DETOXIFY_URL_ORIGINAL"]
    n = len(server.requests)
    assert n >= 3  # the checkpoint, config.json, vocab.txt (+ the optional tokenizer files, 404 here)
    assert resolve_paths(detox(), places).checkpoint == out.checkpoint
    assert len(server.requests) == n  # the second resolution finds the store


@pytest.mark.parametrize("setting", [{"CROSSAUDIT_OFFLINE": "1"}, {"HF_HUB_OFFLINE": "1"}])
def test_offline_mode_stops_before_the_download(tmp_path, places, server, setting) -> None:
    serve_detoxify(server, places)
    with pytest.raises(ConfigurationError) as info:
        resolve_paths(detox(), places | setting)
    assert server.requests == []
    msg = str(info.value)
    assert msg.startswith("detoxify checkpoint (variant original): not found.\nTo fix it:\n")
    lines = [line.strip() for line in msg.split("Tried, in order:\n")[1].splitlines()]
    assert lines[0].startswith("1. the evaluator's `checkpoint`, then CROSSAUDIT_DETOXIFY_CHECKPOINT_ORIGINAL")
    assert lines[1].startswith(f"2. model store {places['CROSSAUDIT_MODEL_STORE']}")
    assert lines[2].startswith("3. Detoxify's torch hub cache") and "toxic_original-c1212f89.ckpt" in lines[2]
    assert lines[3].startswith("4. download from ") and "skipped, offline mode is on" in lines[3]
    assert "`crossaudit models pull detoxify --variant original`" in msg
    assert "`crossaudit models import detoxify PATH --variant original`" in msg
    assert not NETWORK_CLAIM.search(msg)


def test_a_failed_download_is_reported_as_tried(tmp_path, places, server) -> None:
    places["CROSSAUDIT_DETOXIFY_URL"] = server.url + "/"  # nothing served: 404
    with pytest.raises(ConfigurationError) as info:
        resolve_paths(detox(), places)
    assert "4. download from " in str(info.value) and "failed: downloading" in str(info.value)
    assert "HTTP 404" in str(info.value)
    assert ModelStore(places["CROSSAUDIT_MODEL_STORE"]).entries() == []


def test_missing_config_directory_names_its_own_fixes(tmp_path, places) -> None:
    with pytest.raises(ConfigurationError) as info:
        resolve_paths(detox(checkpoint="/m/x.ckpt"), places | {"CROSSAUDIT_OFFLINE": "1"})
    msg = str(info.value)
    assert msg.startswith("detoxify Hugging Face config/tokenizer for bert-base-uncased")
    assert "CROSSAUDIT_DETOXIFY_CONFIG" in msg and "Hugging Face hub cache" in msg
    assert "`crossaudit models import bert-base-uncased DIR`" in msg and not NETWORK_CLAIM.search(msg)


def test_an_onnx_export_needs_no_config_directory(tmp_path, places) -> None:
    from crossaudit.modelserver import onnxfiles

    export = tmp_path / "export"
    export.mkdir()
    (export / onnxfiles.SIDECAR_FILE).write_text("{}")
    (export / onnxfiles.TOKENIZER_FILE).write_text("{}")
    (export / "model.onnx").write_bytes(b"onnx")
    offline = places | {"CROSSAUDIT_OFFLINE": "1"}
    out = resolve_paths(detox(checkpoint=str(export)), offline)
    assert out.checkpoint == str(export) and out.huggingface_config_path is None
    entry = ModelStore(places["CROSSAUDIT_MODEL_STORE"]).import_path("detoxify", export, "original")
    out = resolve_paths(detox(), offline)  # the store's export wins; no config searched for
    assert out.checkpoint == str(entry.files_dir) and out.huggingface_config_path is None


# --- presidio (spaCy) ---------------------------------------------------------------------------


def install_spacy_package(root: Path, name: str = "xx_crossaudit_test_sm") -> Path:
    """A real installed-package layout (what `spacy download` leaves): package dir + dist-info."""
    pkg = root / name
    data = pkg / f"{name}-3.8.0"
    data.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    lang, _, rest = name.partition("_")
    (pkg / "meta.json").write_text(json.dumps({"lang": lang, "name": rest, "version": "3.8.0"}))
    (data / "config.cfg").write_text("[nlp]\n")
    dist = root / f"{name}-3.8.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 3.8.0\n")
    return data


def store_spacy(tmp_path: Path, env: dict[str, str]) -> Path:
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "config.cfg").write_text("[nlp]\n")
    return ModelStore(env["CROSSAUDIT_MODEL_STORE"]).import_path(env["CROSSAUDIT_SPACY_PACKAGE"], pipe).files_dir


def test_presidio_order_explicit_store_installed(tmp_path, places, server, monkeypatch) -> None:
    site = tmp_path / "site"
    installed = install_spacy_package(site)
    monkeypatch.syspath_prepend(str(site))
    assert resolve_paths(presidio(), places).spacy_model_path == str(installed)  # step 3
    stored = store_spacy(tmp_path, places)
    assert resolve_paths(presidio(), places).spacy_model_path == str(stored)  # step 2 wins over 3
    env = places | {"CROSSAUDIT_SPACY_MODEL": "/p/pipe"}
    assert resolve_paths(presidio(), env).spacy_model_path == "/p/pipe"  # step 1 wins over 2
    cfg = presidio().model_copy(update={"spacy_model_path": "/c/pipe"})
    assert resolve_paths(cfg, env).spacy_model_path == "/c/pipe"
    assert server.requests == []


def test_presidio_downloads_only_when_an_entity_needs_ner(tmp_path, places, server) -> None:
    import zipfile

    wheel = tmp_path / "w.whl"
    name = places["CROSSAUDIT_SPACY_PACKAGE"]
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{name}/{name}-3.8.0/config.cfg", "[nlp]\n")
    server.add(f"/{name}-3.8.0/{name}-3.8.0-py3-none-any.whl", wheel.read_bytes())
    places["CROSSAUDIT_SPACY_MODELS_URL"] = server.url
    # pattern entities only: a blank pipeline, no download
    assert resolve_paths(presidio("EMAIL", "SSN"), places).spacy_model_path is None
    assert server.requests == []
    # offline, PERSON: refused before any request, listing what was tried
    with pytest.raises(ModelRequiredError) as info:
        resolve_paths(presidio(), places | {"HF_HUB_OFFLINE": "1"})
    msg = str(info.value)
    assert "PERSON" in msg and "Tried, in order:" in msg and "skipped, offline mode is on (HF_HUB_OFFLINE=1)" in msg
    assert f"`crossaudit models pull {name}`" in msg and f"`crossaudit models import {name} DIR`" in msg
    assert "installed spaCy package" in msg and not NETWORK_CLAIM.search(msg)
    assert model_problem(presidio(), places | {"HF_HUB_OFFLINE": "1"}) is not None
    assert server.requests == []
    # validate/deploy time, downloads allowed: the model counts as available, nothing is fetched
    assert model_problem(presidio(), places) is None
    assert server.requests == []
    # online, PERSON: the official release is downloaded into the store and used
    out = resolve_paths(presidio(), places)
    assert Path(out.spacy_model_path, "config.cfg").is_file()
    assert ModelStore(places["CROSSAUDIT_MODEL_STORE"]).get(name) is not None
    assert len(server.requests) == 1


def test_no_error_claims_the_network_is_unreachable() -> None:
    import crossaudit.modelserver as pkg

    for path in Path(pkg.__file__).parent.rglob("*.py"):
        assert not re.search(r"hubs? (are|is) not reachable", path.read_text()), path
