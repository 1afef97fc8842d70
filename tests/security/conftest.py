"""Security tests that attack the real service reuse the e2e server fixture."""

from tests.e2e.conftest import server  # noqa: F401 - a fixture, found by pytest by name
