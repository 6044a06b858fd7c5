"""The abuse tier: a stranger's inputs against real bookie processes (the ``bookies`` fixture of
tests/conftest.py), each attack with the bound it must stay within. Helpers in ``helpers.py``."""
