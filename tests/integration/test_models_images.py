"""The containerised Presidio model server: build the image from the local base, run it with no
network and a read-only root, and call it over a unix socket in a mounted directory.

The build installs presidio + spaCy into the image (about two minutes, ~0.5 GB, cached by
Docker afterwards). It runs in `make test` and CI; the detoxify image (torch, ~3 GB) is not built.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time

import grpc
import pytest

from crossaudit.modelserver.pool import verdict_from_reply
from crossaudit.modelserver.testing import build_spacy_pipeline
from crossaudit.v1 import modelserver_pb2 as pb
from crossaudit.v1 import modelserver_pb2_grpc as pb_grpc

pytestmark = [
    pytest.mark.models,
    pytest.mark.docker,
    pytest.mark.slow,
]


def test_presidio_image_serves_over_unix_socket(docker_daemon, tmp_path) -> None:
    from crossaudit.modelserver.images import build

    tag = build("presidio")
    pipeline = build_spacy_pipeline(tmp_path / "pipeline")
    sockdir = tempfile.mkdtemp(prefix="ca-img-sock-")
    os.chmod(sockdir, 0o777)  # the server runs as an unprivileged uid inside the container
    os.chmod(tmp_path, 0o755)
    name = f"ca-test-presidio-{os.getpid()}"
    proc = subprocess.Popen(
        ["docker", "run", "--rm", "--name", name, "--network", "none", "--read-only", "--cap-drop", "ALL",
         "--security-opt", "no-new-privileges", "--tmpfs", "/tmp:size=16m", "-v", f"{sockdir}:/run/crossaudit",
         "-v", f"{pipeline}:/models/spacy:ro", tag],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert json.loads(line)["address"] == "unix:/run/crossaudit/presidio.sock", proc.stderr.read()
        text = "Mail john@example.com or call John Smith."
        with grpc.insecure_channel(f"unix:{sockdir}/presidio.sock") as channel:
            stub = pb_grpc.ModelServerStub(channel)
            for _ in range(200):  # bounded wait for the model to load (~seconds)
                if stub.Health(pb.ModelHealthRequest(), timeout=5).ready:
                    break
                time.sleep(0.1)
            reply = stub.Analyze(pb.AnalyzeRequest(
                model="presidio", config_json=json.dumps({"model": "presidio", "spacy_model_path": "/models/spacy",
                                                          "entities": ["PERSON", "EMAIL_ADDRESS"]}),
                response=text), timeout=60)
        v = verdict_from_reply(reply)
        assert {(s.label, text[s.start:s.end]) for s in v.spans} == {
            ("EMAIL_ADDRESS", "john@example.com"), ("PERSON", "John Smith")}
    finally:
        subprocess.run(["docker", "stop", "-t", "2", name], capture_output=True, timeout=60, check=False)
        proc.wait(timeout=60)
