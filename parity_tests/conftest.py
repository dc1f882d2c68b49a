"""Shared test setup: the ``--impl`` option and the hypothesis profiles.

``pytest --impl=jax`` or ``--impl=torch`` runs the implementation-generic tests (those
taking the ``impl`` fixture) against one implementation; by default they run on both.
Parity tests compare the two and always use both.

Hypothesis profiles (``HYPOTHESIS_PROFILE=...``): ``ci`` (default; derandomized, 25
examples, the suite stays within minutes on 2 cores), ``dev`` (random, 100 examples),
``thorough`` (random, 1000 examples). ``deadline=None`` since the first example of a
test pays JAX's compile.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from parity_tests.impls import IMPLS

settings.register_profile(
    "ci", derandomize=True, max_examples=25, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


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
