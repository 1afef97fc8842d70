"""The Kubernetes manifests of deploy/k8s/ are valid for recent Kubernetes versions (JSON schemas
shipped inside the ``kubernetes-validate`` package: no cluster, no network), and say what the
deployment design needs: grpc probes on the served port, a headless Service, a PDB over the
Deployment's pods, non-root containers, a Secret template without real values, every file the
store URL names mounted, the evidence signing key and retention operator key as owner-only files
(never variables), and the image pinned to a content tag (never ``:latest``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from crossaudit.cli import secretfiles
from crossaudit.governance.evidence import unsigned_log
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.service import image as builder
from crossaudit.service.health import LIVENESS_SERVICE
from crossaudit.service.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
VERSIONS = ("1.30", "1.33")  # every manifest must be valid for each (strict: no unknown field)

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[dev]'")


def _documents(where: Path = K8S) -> list[tuple[str, dict[str, Any]]]:
    """Every Kubernetes object under ``where`` (the kustomization is kustomize's, not the API's)."""
    docs = []
    for path in sorted(where.glob("*.yaml")):
        if path.name == builder.KUSTOMIZATION:
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path.name, doc))
    return docs


DOCS = _documents()


def _one(kind: str) -> dict[str, Any]:
    (found,) = [d for _, d in DOCS if d["kind"] == kind and d["metadata"]["name"] == "crossaudit"]
    return found


def _container(name: str = "orchestrator") -> dict[str, Any]:
    (c,) = [c for c in _one("Deployment")["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def test_the_manifests_are_there() -> None:
    kinds = sorted(d["kind"] for _, d in DOCS)
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Secret", "Secret", "Service"], kinds


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("name", "doc"), DOCS, ids=[f"{n}:{d['kind']}:{d['metadata']['name']}" for n, d in DOCS])
def test_each_manifest_is_valid(name: str, doc: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{name} ({doc['kind']}) is invalid for Kubernetes {version}: {e.message} at {list(e.path)}")


def test_probes_are_grpc_on_the_served_port() -> None:
    c = _container()
    args = c["args"]
    port = int(next(a for a in args if a.startswith("--port=")).split("=", 1)[1])
    assert "--host=0.0.0.0" in args
    assert {"name": "grpc", "containerPort": port, "protocol": "TCP"} in c["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert set(c[probe]) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}, probe
        assert c[probe]["grpc"]["port"] == port, probe
    for probe in ("startupProbe", "readinessProbe"):
        assert c[probe]["grpc"].get("service", "") == "", probe  # the server's overall status
    # not the overall status, which is NOT_SERVING while PostgreSQL is down: a restart would not
    # bring the database back, and a replica cannot start without it (a crash loop)
    assert c["livenessProbe"]["grpc"]["service"] == LIVENESS_SERVICE


def test_replicas_store_and_docker_daemon() -> None:
    dep = _one("Deployment")
    assert dep["spec"]["replicas"] == 3
    c = _container()
    assert not any(a.startswith("--store") for a in c["args"])  # the URL holds a password: env, not argv
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert env["DOCKER_HOST"]["value"].startswith("tcp://$(NODE_IP):")
    assert env["CROSSAUDIT_STORE"]["valueFrom"]["secretKeyRef"] == {"name": "crossaudit-secrets", "key": "store-url"}
    cm = _one_named("ConfigMap", "crossaudit-settings")
    assert cm["data"]["DOCKER_TLS_VERIFY"] == "1"
    assert c["resources"]["requests"] and c["resources"]["limits"]


def _one_named(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for _, d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def test_containers_run_non_root_read_only() -> None:
    pod = _one("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    for c in [*pod["containers"], *pod.get("initContainers", [])]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
        assert c["resources"]["limits"], c["name"]
    mounted = {m["mountPath"] for m in _container()["volumeMounts"]}
    assert {"/tmp", "/var/lib/crossaudit"} <= mounted  # writable places of a read-only root


def test_service_is_headless_over_the_pods() -> None:
    svc = _one("Service")
    dep = _one("Deployment")
    assert svc["spec"]["clusterIP"] == "None"
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    (grpc_port,) = [p for p in svc["spec"]["ports"] if p["name"] == "grpc"]
    assert grpc_port["targetPort"] == "grpc"


def test_pdb_selects_the_deployments_pods() -> None:
    pdb = _one("PodDisruptionBudget")
    dep = _one("Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert 0 < pdb["spec"]["minAvailable"] < dep["spec"]["replicas"]  # a drain can still proceed


def test_secret_is_a_template_and_mounted_privately() -> None:
    secret = _one_named("Secret", "crossaudit-secrets")
    values = secret["stringData"]
    assert set(values) == {
        "api-keys.yaml", "store-url", "postgres-ca.crt", "evidence-signing.pem", "retention-operator.key"
    }  # fmt: skip
    assert all("REPLACE" in v for v in values.values())
    tls = _one_named("Secret", "crossaudit-docker-tls")
    assert all("REPLACE" in v for v in tls["stringData"].values())
    cm = _one_named("ConfigMap", "crossaudit-settings")
    assert cm["data"]["CROSSAUDIT_API_KEYS_FILE"].startswith("/etc/crossaudit/keys/")
    pod = _one("Deployment")["spec"]["template"]["spec"]
    (keys,) = [v for v in pod["volumes"] if v["name"] == "keys"]
    assert keys["emptyDir"]["medium"] == "Memory"  # the 0600 copy the init container makes
    (init,) = pod["initContainers"]
    assert "umask 077" in init["command"][-1]


KEY_FILE_VARIABLES = {  # the settings' variables naming each key file, and the Secret key it comes from
    "CROSSAUDIT_EVIDENCE__SIGNING_KEY_FILE": secretfiles.EVIDENCE_KEY,
    "CROSSAUDIT_RETENTION__OPERATOR_KEY_FILE": secretfiles.OPERATOR_KEY,
    "CROSSAUDIT_API_KEYS_FILE": secretfiles.API_KEYS,
}


def _settings_env() -> dict[str, str]:
    """The orchestrator's CROSSAUDIT_* variables: the ConfigMap's, then the container's own."""
    cm = _one_named("ConfigMap", "crossaudit-settings")
    env = {k: v for k, v in cm["data"].items() if k.startswith("CROSSAUDIT_")}
    for e in _container().get("env", []):
        if e["name"].startswith("CROSSAUDIT_"):
            env[e["name"]] = e.get("value", "postgresql://from-a-secret@db/crossaudit")
    return env


def test_every_replica_signs_its_log_with_a_key_file_from_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifests used to give no evidence.signing_key_file: replicas on PostgreSQL kept their
    logs unsigned and `audit verify` said FAILED. The settings name each key by path; the init
    container copies it owner-only from the Secret into the memory volume that the orchestrator
    mounts read-only; so the start line has no UNSIGNED warning."""
    for name in [n for n in os.environ if n.startswith("CROSSAUDIT_")]:
        monkeypatch.delenv(name)
    env = _settings_env()
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    config = load_settings().config
    assert config.store_url and unsigned_log(config.evidence, shared_store=True) is None
    assert config.evidence.signing_key_env is None and config.retention.operator_key_env is None
    pod = _one("Deployment")["spec"]["template"]["spec"]
    (keys_mount,) = [m for m in _container()["volumeMounts"] if m["name"] == "keys"]
    assert keys_mount["readOnly"] is True
    (init,) = pod["initContainers"]
    (src_mount,) = [m for m in init["volumeMounts"] if m["name"] == "keys-src"]
    (keys_src,) = [v for v in pod["volumes"] if v["name"] == "keys-src"]
    copied = {i["path"] for i in keys_src["secret"]["items"]}
    script = init["command"][-1]
    assert script.startswith("umask 077 && cp ")  # owner-only copies, whatever the Secret volume's mode
    for var, key in KEY_FILE_VARIABLES.items():
        path = Path(env[var])
        assert str(path.parent) == keys_mount["mountPath"], var
        assert {"key": key, "path": path.name} in keys_src["secret"]["items"], key
        assert f"{src_mount['mountPath']}/{path.name}" in script.split(), (key, script)
    assert copied == set(KEY_FILE_VARIABLES.values())
    assert {secretfiles.EVIDENCE_KEY, secretfiles.OPERATOR_KEY, secretfiles.API_KEYS} <= {
        f.name for f in secretfiles.SECRET_FILES
    }  # `crossaudit config secrets` makes each of them


def test_no_key_material_is_an_environment_variable() -> None:
    """Keys are files: a variable shows in /proc/PID/environ, in `kubectl describe` and every child
    process. No *_KEY_ENV setting, and no Secret key of a key file, is ever put in the environment."""
    key_files = set(KEY_FILE_VARIABLES.values())
    cm = _one_named("ConfigMap", "crossaudit-settings")
    assert not [k for k in cm["data"] if k.endswith("_KEY_ENV") or "PRIVATE KEY" in cm["data"][k]]
    pod = _one("Deployment")["spec"]["template"]["spec"]
    for c in [*pod["containers"], *pod.get("initContainers", [])]:
        for e in c.get("env", []):
            assert not e["name"].endswith("_KEY_ENV"), e
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            assert ref is None or ref["key"] not in key_files, e
        for source in c.get("envFrom", []):
            assert "secretRef" not in source, c["name"]  # a whole Secret as variables would include the keys


# libpq reads each of these from a file; without the parameter, some default to $HOME/.postgresql/…
LIBPQ_FILES = ("sslrootcert", "sslcert", "sslkey", "sslcrl", "passfile")
LIBPQ_FILE_ENV = {"sslrootcert": "PGSSLROOTCERT", "sslcert": "PGSSLCERT", "sslkey": "PGSSLKEY",
                  "sslcrl": "PGSSLCRL", "passfile": "PGPASSFILE"}


def _files_mounted(container: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """Path -> (kind, name, key) of every file a Secret or ConfigMap volume puts in ``container``."""
    pod = _one("Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    out: dict[str, tuple[str, str, str]] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        sources = [(k, volume[f]) for k, f in (("Secret", "secret"), ("ConfigMap", "configMap")) if f in volume]
        kind, source = sources[0] if sources else (None, None)
        if source is None or mount.get("subPath"):
            continue
        name = source.get("secretName") or source["name"]
        (doc,) = [d for _, d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
        keys = {**doc.get("data", {}), **doc.get("stringData", {})}
        items = source.get("items") or [{"key": k, "path": k} for k in keys]
        for item in items:
            assert item["key"] in keys, f"{kind} {name} has no key {item['key']!r} (volume {mount['name']})"
            out[f"{mount['mountPath'].rstrip('/')}/{item['path']}"] = (kind, name, item["key"])
    return out


def test_the_store_url_finds_every_file_it_needs_in_a_mount() -> None:
    """The template starts as written: sslmode=verify-full needs a CA file, and libpq looks for it
    in $HOME/.postgresql/root.crt unless sslrootcert names one. Every file the URL (or a PG*
    variable) names must be one a Secret/ConfigMap volume mounts; none may come from HOME."""
    from psycopg.conninfo import conninfo_to_dict

    secret = _one_named("Secret", "crossaudit-secrets")
    params = conninfo_to_dict(secret["stringData"]["store-url"])
    c = _container()
    env = {e["name"]: e.get("value") for e in c["env"]}
    files = {p: params.get(p) or env.get(LIBPQ_FILE_ENV[p]) for p in LIBPQ_FILES}
    if params.get("sslmode") in ("verify-ca", "verify-full"):
        assert files["sslrootcert"], (
            f"sslmode={params['sslmode']} without sslrootcert: libpq reads $HOME/.postgresql/root.crt, "
            f"which nothing provides (HOME={env.get('HOME')!r}): every replica would exit at start"
        )
    mounted = _files_mounted(c)
    for param, path in files.items():
        if not path or (param == "sslrootcert" and path == "system"):
            continue
        assert path.startswith("/") and "~" not in path, f"{param}={path}: not an absolute path"
        assert path in mounted, f"{param}={path} is no file a volumeMount provides ({sorted(mounted)})"
        if "HOME" in env:
            assert not path.startswith(env["HOME"].rstrip("/") + "/"), f"{param}={path} relies on HOME"
    if files["sslrootcert"] and files["sslrootcert"] != "system":
        assert mounted[files["sslrootcert"]] == ("Secret", "crossaudit-secrets", "postgres-ca.crt")


def _images(docs: list[tuple[str, dict[str, Any]]] = DOCS) -> list[tuple[str, str, str]]:
    """(container, image, pull policy) of every container and init container."""
    out = []
    for _, doc in docs:
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            out.append((c["name"], c["image"], c.get("imagePullPolicy", "")))
    return out


def test_images_are_pinned_to_a_content_tag_never_latest() -> None:
    """With imagePullPolicy IfNotPresent a node never pulls a moved ``:latest`` again: only a new
    tag makes it run a new build, so every image names the content tag ``make image`` builds."""
    for path in K8S.glob("*.yaml"):
        assert ":latest" not in path.read_text(), f"{path.name} names :latest"
    images = _images()
    assert {name for name, _, _ in images} == {"orchestrator", "private-keys"}
    for name, ref, policy in images:
        repo, sep, tag = ref.rpartition(":")
        assert sep and "/" not in tag, f"{name}: {ref} has no tag (that is :latest)"
        assert repo == builder.REPO, ref
        assert builder.CONTENT_TAG.fullmatch(tag), f"{name}: {tag!r} is not a content tag as `build` makes"
        assert policy == "IfNotPresent", name


def test_the_kustomization_pins_the_same_tag() -> None:
    k = yaml.safe_load((K8S / builder.KUSTOMIZATION).read_text())
    assert (k["apiVersion"], k["kind"]) == ("kustomize.config.k8s.io/v1beta1", "Kustomization")
    not_applied = {builder.KUSTOMIZATION, "secret.template.yaml"}
    applied = sorted(p.name for p in K8S.glob("*.yaml") if p.name not in not_applied)
    assert sorted(k["resources"]) == applied  # the Secret template holds placeholders: created by hand
    (entry,) = k["images"]
    assert entry["name"] == builder.REPO and set(entry) == {"name", "newTag"}
    assert isinstance(entry["newTag"], str) and builder.CONTENT_TAG.fullmatch(entry["newTag"]), entry
    assert {ref.rpartition(":")[2] for _, ref, _ in _images()} == {entry["newTag"]}


def test_pin_writes_a_builds_tag_and_nothing_else(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    before = {p.name: p.read_text() for p in copy.glob("*.yaml")}
    changed = builder.pin_manifests(copy, f"{builder.REPO}:0123456789abcdef")
    assert {p.name for p in changed} == {"deployment.yaml", builder.KUSTOMIZATION}
    assert {ref for _, ref, _ in _images(_documents(copy))} == {f"{builder.REPO}:0123456789abcdef"}
    assert yaml.safe_load((copy / builder.KUSTOMIZATION).read_text())["images"][0]["newTag"] == "0123456789abcdef"
    for name, text in before.items():  # comments and layout kept: only lines naming the tag differ
        after = (copy / name).read_text().splitlines()
        assert len(after) == len(text.splitlines())
        assert all(a == b or "0123456789abcdef" in a for a, b in zip(after, text.splitlines(), strict=True))
    # a numeric-looking tag stays a string in YAML (quoted), and the command line does the same
    assert builder.main(["pin", "1000000000000000", "--manifests", str(copy)]) == 0
    assert "1000000000000000 pinned" in capsys.readouterr().out
    assert yaml.safe_load((copy / builder.KUSTOMIZATION).read_text())["images"][0]["newTag"] == "1000000000000000"
    for bad in ("latest", "0123", "0123456789ABCDEF", "crossaudit/other:0123456789abcdef"):
        with pytest.raises(ConfigurationError):
            builder.pin_manifests(copy, bad)
    assert builder.main(["pin", "latest", "--manifests", str(copy)]) == 1  # one error line, no traceback
    assert "is not a content tag" in capsys.readouterr().err
