"""The wire layer: what the server and its clients (the SDK, the guard proxy, evals, the CLI) share.

- :mod:`~crossaudit.api.records`: the records the store keeps and the API answers with;
- :mod:`~crossaudit.api.models`: what the API adds to them (answers grouped or derived);
- :mod:`~crossaudit.api.replayreport`: a replay's report, filled by the server, read by clients;
- :mod:`~crossaudit.api.convert`: the one codec between those and the protobuf messages;
- :mod:`~crossaudit.api.errors`: the one error codec at every gRPC edge;
- :mod:`~crossaudit.api.limits`: the defaults both ends agree on (environment, request size).

It imports the kernel, the evidence library, the review rules and the generated messages, and
nothing of the service or the store (the import contract says so), so a client never loads them.
"""
