"""Root test configuration: what the mutation tester (mutmut) needs from the suite.

mutmut runs the suite once in a "stats" phase to learn which tests reach which function
(through trampolines it puts in front of every mutated function), then, for each
mutant, only those tests, stopping at the first failure. Two things matter with JAX:

* A jitted function calls its Python body only when it is traced. In the stats phase
  every test therefore starts with empty JAX caches (and empty ``lru_cache``s of compiled
  programs), so a test that reaches a function through a trace compiled by an earlier
  test is still recorded as reaching it.
* For a mutant, ``mutation.selection`` says which of the tests that reach it run and
  in which order: its recorded killer first, then cheapest first. "Cheapest" is what
  a test costs when a run starts with it: its setup, call and teardown and the setup
  of each shared fixture it uses (a module fixture that spawns DDP ranks for 12 s),
  measured in the stats phase (``pytest_runtest_makereport``).
  The test that fails first is written to ``kills.tsv`` in ``mutants/`` (below) and
  ``mutation.report --record`` keeps it with the verdict, so the next run tries it first.

Each mutant's tests run in a fork of a process that has imported JAX, torch and every
test module (half a million objects); with ``mutation.runner`` (``mutation.full``) as
items of that process's open pytest session, without a pytest start of their own. Two
costs there are the garbage collector's, not the tests': pytest's
``unraisableexception`` plugin collects garbage five times per session (0.8 s a mutant
here; ``pyproject.toml`` turns it off for mutmut), and every full collection in a fork
walks the parent's objects (and copies their pages). After the warm-up collection those
objects are moved out of the collector's sight (``gc.freeze``, see
``pytest_collection_finish``). Measured here: with the plugin off a killed mutant of the
loss costs 0.25 s instead of 1.0 s; with the freeze too, 40 of its tests run in 0.28 s
instead of 0.60 s.

The multi-process tests run the DDP code in spawned ranks, where mutmut's stats see
nothing: in the stats phase each rank writes what it reached to a folder, and the hooks
below file it under the test that started the ranks, and, when a module-scoped fixture
started them, under every test that uses that fixture (each one judges the ranks'
results).

Outside mutmut (``MUTANT_UNDER_TEST`` unset) the hooks do nothing. This file also
registers the hypothesis profiles of the whole suite (``HYPOTHESIS_PROFILE=...``): ``ci``
(the default: derandomized, 25 examples, so the suite stays within minutes on 2 cores),
``dev`` (random, 100 examples), ``thorough`` (random, 1000 examples). ``deadline=None``
since the first example of a test pays JAX's compile (and math-verify's sympy warm-up).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, max_examples=25, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _mutmut_phase() -> str:
    return os.environ.get("MUTANT_UNDER_TEST", "")


def _in_mutants() -> bool:
    return Path(__file__).resolve().parent.name == "mutants"


if _mutmut_phase() or _in_mutants():
    # Each mutant runs in a fresh fork: without a persistent cache every one recompiles
    # every jitted function its tests reach. XLA programs that a mutant does not change
    # are then loaded from disk (a mutant's own programs compile, as they must).
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                          str(Path(__file__).resolve().parent / ".jax-cache"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per mutmut worker


def pytest_collection_finish(session):
    # mutmut's fork server warms up with ``pytest --collect-only`` and forks a worker per
    # mutant: freeze what the warm-up built so the workers' collections skip it.
    if _in_mutants() and session.config.option.collectonly:
        import gc

        from mutation import selection

        selection.recorded_killers()
        gc.collect()
        gc.freeze()


def pytest_configure(config):
    if _mutmut_phase() == "stats":
        # The multi-process tests run the DDP code in spawned children: they report what
        # they reached here (scaleup/tests/dist_helpers.py), see pytest_runtest_teardown.
        import tempfile

        os.environ["MUTMUT_CHILD_HITS_DIR"] = tempfile.mkdtemp(prefix="mutmut-hits-")


#: What the children started by a shared (module- or session-scoped) fixture reached, by
#: (test module, fixture name): the ranks run once, in the setup of the first test that
#: asks for the fixture, but every test using it judges their results.
_SHARED_FIXTURE_HITS: dict[tuple[str, str], set[str]] = {}


def _shared_fixtures(item) -> list[tuple[str, str]]:
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return [(item.module.__name__, name) for name in item.fixturenames
            if name in defs and defs[name][-1].scope != "function"]


@pytest.hookimpl(tryfirst=True)  # before mutmut's own teardown hook files the hits
def pytest_runtest_teardown(item, nextitem):
    out = os.environ.get("MUTMUT_CHILD_HITS_DIR")
    if _mutmut_phase() != "stats" or not out:
        return
    from mutmut.state import state

    new: set[str] = set()
    for hits in Path(out).glob("hits-*.txt"):
        new.update(n for n in hits.read_text().split("\n") if n)
        hits.unlink()
    shared = _shared_fixtures(item)
    for key in shared:  # children of this test's shared fixtures (or of the test itself)
        _SHARED_FIXTURE_HITS.setdefault(key, set()).update(new)
        new |= _SHARED_FIXTURE_HITS[key]
    state()._stats.update(new)


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


#: In the stats phase: what setting up each shared (module- or session-scoped) fixture
#: cost, by its definition (the setup time of the first test that asked for it), and
#: what each test costs when a mutant's run starts with it (mutation.selection's order).
_FIXTURE_SETUP: dict[tuple[str, str], float] = {}
_COST_ALONE: dict[str, float] = {}


def pytest_runtest_makereport(item, call):
    # mutmut's stats time only a test's call phase. Its timeouts (a multiple of the sum
    # over a mutant's tests) then miss the setups (two DDP ranks spawned by a module
    # fixture: 12 s), so each test's duration here also counts its setup and teardown.
    # The order of a mutant's tests needs more: the first test of a module fixture that a
    # mutant's run reaches pays that fixture's setup again, so its cost alone (written to
    # mutation-costs.json at the end of the stats) adds the setup of each shared fixture
    # it uses.
    if _mutmut_phase() != "stats":
        return
    from mutmut.state import state

    nodeid, seconds = item.nodeid, call.duration
    if call.when == "setup":
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        shared = [(defs[n][-1].baseid, n) for n in item.fixturenames
                  if n in defs and defs[n][-1].scope != "function"]
        built = [k for k in shared if k not in _FIXTURE_SETUP]
        for key in built:  # this test's setup built them (and its own fixtures)
            _FIXTURE_SETUP[key] = seconds
        _COST_ALONE[nodeid] = _COST_ALONE.get(nodeid, 0.0) + sum(
            _FIXTURE_SETUP[k] for k in shared if k not in built)
    _COST_ALONE[nodeid] = _COST_ALONE.get(nodeid, 0.0) + seconds
    if call.when != "call":  # mutmut adds the call itself
        durations = state().duration_by_test
        durations[nodeid] = durations.get(nodeid, 0.0) + seconds


def pytest_sessionfinish(session):
    if _mutmut_phase() == "stats" and _COST_ALONE:
        from mutation import selection

        selection.add_costs(_COST_ALONE)


def pytest_collection_modifyitems(config, items):
    # A mutant run as a pytest session of its own: mutation.selection's tests, in its
    # order (mutation.runner uses the same in its open session).
    phase = _mutmut_phase()
    if not phase or phase in ("stats", "fail", "mutant_generation"):
        return
    from mutation import selection

    kept = selection.for_mutant(items, phase, selection.durations(),
                                selection.recorded_killers())
    if len(kept) < len(items):
        dropped = set(map(id, kept))
        config.hook.pytest_deselected(items=[i for i in items if id(i) not in dropped])
    items[:] = kept


def pytest_runtest_logreport(report):
    # Which test killed a mutant (mutmut stops at the first failure, records only the
    # exit code): one line per kill in mutants/kills.tsv, "mutant<TAB>test<TAB>seconds",
    # read by ``mutation.report --record`` into the ledger, so later runs try it first
    # (pytest_collection_modifyitems).
    phase = _mutmut_phase()
    if not phase or phase in ("stats", "fail", "mutant_generation") or not report.failed:
        return
    line = f"{phase}\t{report.nodeid.removeprefix('mutants/')}\t{report.duration:.3f}\n"
    fd = os.open("kills.tsv", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())  # one write of a short line: atomic under O_APPEND
    finally:
        os.close(fd)
