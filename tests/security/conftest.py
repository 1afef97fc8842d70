"""Security tests that attack the real service reuse the e2e server fixture (and its clients)."""

from tests.e2e.conftest import acme, globex, server  # noqa: F401 - fixtures, found by pytest by name
