"""Root test configuration: what the mutation tester (mutmut) needs from the suite.

mutmut runs the suite once in a "stats" phase to learn which tests reach which function
(through trampolines it puts in front of every mutated function), then, for each
mutant, only those tests, stopping at the first failure. Two things matter with JAX:

* A jitted function calls its Python body only when it is traced. In the stats phase
  every test therefore starts with empty JAX caches (and empty ``lru_cache``s of compiled
  programs), so a test that reaches a function through a trace compiled by an earlier
  test is still recorded as reaching it.
* For a mutant, the tests run cheapest first (the durations measured in the stats phase),
  so a killed mutant is usually killed in well under a second.

Outside mutmut (``MUTANT_UNDER_TEST`` unset) this file does nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _mutmut_phase() -> str:
    return os.environ.get("MUTANT_UNDER_TEST", "")


def pytest_runtest_setup(item):
    if _mutmut_phase() != "stats":
        return
    import sys

    if "jax" in sys.modules:
        import jax

        jax.clear_caches()
    for module, name in (("jaxgrpo.counting", "_compiled_train"), ("jaxgrpo.lm", "_compiled_train"),
                         ("jaxgrpo.sharding", "sharded_train")):
        cached = getattr(sys.modules.get(module), name, None)
        if cached is not None and hasattr(cached, "cache_clear"):
            cached.cache_clear()


def pytest_collection_modifyitems(config, items):
    phase = _mutmut_phase()
    if not phase or phase in ("stats", "fail", "mutant_generation"):
        return
    stats = Path("mutmut-stats.json")  # mutmut runs the tests from inside mutants/
    if not stats.is_file():
        return
    durations = json.loads(stats.read_text()).get("duration_by_test", {})
    items.sort(key=lambda item: durations.get(item.nodeid, durations.get(
        "mutants/" + item.nodeid, float("inf"))))
