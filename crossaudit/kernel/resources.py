"""The images' build contexts, one place to find them.

They live in ``images/`` at the top of the repository; the package reaches them as
``crossaudit/images`` (in the repository a link to ``../images``, in the wheel a copy: setuptools
follows the link when it builds one), so a checkout and an installed wheel build the same images.
"""

from __future__ import annotations

from pathlib import Path

IMAGES_DIR = Path(__file__).resolve().parents[1] / "images"


def image_dir(name: str) -> Path:
    """The build context of image ``name`` (``runner``, ``orchestrator``, ``detoxify``, ...)."""
    return IMAGES_DIR / name
