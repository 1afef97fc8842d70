"""The Python SDK: :class:`~crossaudit.sdk.client.Client` / ``AsyncClient`` (gRPC) and
:class:`~crossaudit.sdk.tester.PolicyTester` (in-process)."""
