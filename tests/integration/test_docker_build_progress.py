"""Each Dockerfile step of an image build moves the progress fraction, against the real daemon:
clients show one line per step and the server forwards an event whenever its fraction moves
(issue 19: a dependency image's steps were all reported at one fraction, so a piped
``evaluator upload`` could show none of them)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from crossaudit.imagebuild import CONTENT_LABEL
from sandbox.docker.images import IMAGE_LABEL, ImageManager

pytestmark = [pytest.mark.docker]


def test_build_steps_move_the_fraction_across_their_span(docker_daemon, tmp_path: Path) -> None:
    mgr = ImageManager(docker_daemon)
    base = mgr.local_base_tag()
    if not mgr.exists(base):  # a fresh machine: the local base, built without any registry
        mgr._local_base(lambda _m, _f: None, force=False)
    (tmp_path / "Dockerfile").write_text(f"FROM {base}\nLABEL first=1\nLABEL second=2\nLABEL third=3\n")
    tag = f"crossaudit/test-progress:{uuid.uuid4().hex[:12]}"
    heard: list[tuple[str, float]] = []
    try:
        mgr.builder.build(tmp_path, tag, progress=lambda m, f: heard.append((m, f)), frac=0.6, span=0.3,
                          labels={IMAGE_LABEL: "test"})
        labels = docker_daemon.images.get(tag).labels
    finally:
        if mgr.exists(tag):
            docker_daemon.images.remove(tag, force=True)
    assert labels[CONTENT_LABEL] == tag.rpartition(":")[2] and labels[IMAGE_LABEL] == "test"
    steps = [(m.split(" :", 1)[0], round(f, 6)) for m, f in heard if m.startswith("Step ")]
    # the Dockerfile's four steps, then one LABEL step per label: the caller's and the content hash
    assert [s for s, _ in steps] == [f"Step {n}/6" for n in range(1, 7)]
    fractions = [f for _, f in steps]
    assert fractions == sorted(fractions) and len(set(fractions)) == len(fractions)  # each step moves it
    assert fractions[0] == 0.6 and fractions[-1] < 0.9
    other = [f for m, f in heard if not m.startswith("Step ")]
    assert all(0.6 <= f < 0.9 for f in other)  # output lines keep their step's fraction
