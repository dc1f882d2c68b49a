"""Shared test setup: the ``--impl`` option.

``pytest --impl=jax`` or ``--impl=torch`` runs the implementation-generic tests (those
taking the ``impl`` fixture) against one implementation; by default they run on both.
Parity tests compare the two and always use both.

The hypothesis profiles are registered in the root ``conftest.py``.
"""

from __future__ import annotations

from parity_tests.impls import IMPLS


def pytest_addoption(parser):
    parser.addoption(
        "--impl", action="store", default="both", choices=("jax", "torch", "both"),
        help="which implementation the implementation-generic tests run against",
    )


def pytest_generate_tests(metafunc):
    if "impl" in metafunc.fixturenames:
        choice = metafunc.config.getoption("impl")
        names = ("jax", "torch") if choice == "both" else (choice,)
        metafunc.parametrize("impl", [IMPLS[n] for n in names], ids=list(names))
