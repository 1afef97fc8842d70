"""The local base image every CrossAudit image builds ``FROM``: which one, by one rule.

No image registry is needed: ``make images`` (``python -m sandbox.docker build-base``) makes a
Debian bookworm root filesystem with ``mmdebstrap`` and imports it as :func:`local_base_tag`, a tag
that hashes the recipe below (the suite, mmdebstrap's arguments, the import's changes), so the same
recipe gives the same tag on every machine. The sandbox builds it (:mod:`sandbox.docker.images`);
this module only names it and chooses among the local ones (:func:`local_base`).
"""

from __future__ import annotations

from crossaudit.imagebuild import ImageBuilder, content_hash
from crossaudit.kernel.errors import ConfigurationError

BASE_REPO = "crossaudit/base"
SUITE = "bookworm"
BASE_TAG_HEX_CHARS = 12  # the recipe hash in the base's tag (``bookworm-py311-<12 hex digits>``)
# The base's recipe: what mmdebstrap is given and what ``docker import`` adds (both in its tag).
MMDEBSTRAP_ARGS = (
    "--variant=essential",
    "--include=python3",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
)
IMPORT_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
)


def local_base_tag() -> str:
    """The tag of the base this recipe makes (present or not)."""
    recipe = content_hash(SUITE, *MMDEBSTRAP_ARGS, *IMPORT_CHANGES)[:BASE_TAG_HEX_CHARS]
    return f"{BASE_REPO}:{SUITE}-py311-{recipe}"


def local_base(builder: ImageBuilder | None = None) -> str:
    """The local base to build FROM: this recipe's (:func:`local_base_tag`, the one the sandbox
    runner uses) when the daemon has it, else the newest ``crossaudit/base`` image; else
    ConfigurationError naming ``make images``."""
    builder = builder or ImageBuilder()
    tag = local_base_tag()
    if builder.exists(tag):
        return tag
    newest = builder.newest(BASE_REPO)
    if newest is None:
        raise ConfigurationError(f"no local {BASE_REPO} image: run `make images` first")
    return newest
