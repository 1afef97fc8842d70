"""The docker isolation of model servers without a daemon: the setting, and how model paths
become read-only mounts and in-container config paths."""

from __future__ import annotations

import os

import pytest

from crossaudit.kernel.errors import ConfigurationError
from crossaudit.kernel.ownership import owner_alive, owner_id
from crossaudit.modelserver import containers
from crossaudit.modelserver.pool import ENV_MODEL_SERVERS, ModelServerLimits, ModelServerPool, isolation_setting


def test_isolation_defaults_to_subprocess_and_reads_the_environment() -> None:
    assert isolation_setting(None, {}) == "subprocess"
    assert isolation_setting(None, {ENV_MODEL_SERVERS: "Docker"}) == "docker"
    assert isolation_setting("subprocess", {ENV_MODEL_SERVERS: "docker"}) == "subprocess"
    with pytest.raises(ConfigurationError, match="subprocess"):
        isolation_setting("vm", {})


def test_pool_takes_the_setting_and_keeps_imageless_kinds_as_subprocesses() -> None:
    assert ModelServerPool(env={}).isolation == "subprocess"
    pool = ModelServerPool(isolation="docker", env={})
    assert pool.in_container("presidio") and pool.in_container("detoxify")
    assert not pool.in_container("langdetect")  # no image: stays a subprocess
    assert not ModelServerPool(env={ENV_MODEL_SERVERS: "subprocess"}).in_container("presidio")
    with pytest.raises(ConfigurationError, match="unix"):
        ModelServerPool(ModelServerLimits(transport="tcp"), isolation="docker")


def test_model_paths_become_read_only_mounts_at_stable_paths(tmp_path) -> None:
    export = tmp_path / "detox-onnx"
    export.mkdir()
    cfg = {"model": "detoxify", "checkpoint": str(export), "huggingface_config_path": str(tmp_path / "missing"),
           "threshold": 0.5}
    mounts = containers.model_mounts("detoxify", cfg)
    assert list(mounts) == [str(export)]  # a missing path is left for the server to report
    target = mounts[str(export)]
    assert target.startswith(f"{containers.MODEL_ROOT}/detoxify/") and target.endswith("/detox-onnx")
    assert containers.model_mounts("detoxify", cfg) == mounts
    wire = containers.rewrite_paths("detoxify", cfg, mounts)
    assert wire == {**cfg, "checkpoint": target}
    assert cfg["checkpoint"] == str(export)  # the caller's config is not modified

    other = tmp_path / "other" / "detox-onnx"
    other.mkdir(parents=True)
    assert containers.model_mounts("detoxify", {"checkpoint": str(other)})[str(other)] != target
    assert containers.model_mounts("langdetect", {"model": "langdetect"}) == {}


def test_images_default_model_settings_are_blanked() -> None:
    env = containers.preload_env("presidio")
    assert env == {"CROSSAUDIT_SPACY_MODEL": ""}
    assert all(v == "" for v in containers.preload_env("detoxify").values())


def test_owner_label_names_this_process() -> None:
    assert owner_id().endswith(f":{os.getpid()}")
    assert owner_alive(owner_id())
    assert not owner_alive("nonsense")


def test_one_recipe_gives_each_model_its_own_content_tag() -> None:
    """The model is a build argument of the one Dockerfile, and build arguments are content."""
    from crossaudit.imagebuild import content_hash
    from crossaudit.modelserver import images

    base = "crossaudit/base:bookworm-py311-000000000000"
    tags = {kind: images.context_tag(kind, base) for kind in images.KINDS}
    assert set(images.KINDS) == {"detoxify", "presidio"}
    assert {kind: tag.split(":")[0] for kind, tag in tags.items()} == {
        kind: f"crossaudit/modelserver-{kind}" for kind in images.KINDS}
    assert len(set(tags.values())) == len(tags)
    assert images.context_tag("presidio", base) == tags["presidio"]  # stable
    assert images.context_tag("presidio", base + "1") != tags["presidio"]  # the base is an argument too
    assert images.build_args("detoxify", base) == {"BASE": base, "MODEL": "detoxify"}
    assert content_hash("x", buildargs={"A": "1"}) != content_hash("x", buildargs={"A": "2"}) != content_hash("x")
    with pytest.raises(ConfigurationError, match="langdetect"):
        images.context_tag("langdetect", base)  # no image: served as a subprocess
