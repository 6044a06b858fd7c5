"""Fixtures of the integration tier beside tests/conftest.py's: broker processes (``cluster``, ``broker``)."""

from tests.broker_testing import broker, cluster  # noqa: F401
