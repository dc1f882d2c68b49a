"""Which tests judge a mutant, in which order: one place for both ways mutmut runs them.

mutmut gives a mutant every test that reached its function in the stats phase. Of
those, the files of ``MUTATION_SKIPS`` for the mutant's module do not run (a targeted
selection: a mutant of the loss is judged by the math's tests, not by minutes of
trainer runs that reach the loss too), and the rest run in this order: first the test
that killed this mutant in an earlier run, when the ledger names one
(``mutation/ledger.py``), then the others cheapest first (the durations of mutmut's
stats phase; unknown ones last). With ``-x`` a killed mutant then usually costs one
short test.

Used by the root ``conftest.py`` (a mutant run as its own pytest session) and by
``mutation.runner`` (a mutant run in the fork server's open session).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The LM lab's tests (its trainers train transformers for seconds to minutes) are not the
#: tests of the shared math (which has its own), so its mutants are judged without them.
_LM_TESTS = ("parity_tests/test_lm_trainer.py", "parity_tests/test_lm_model.py",
             "parity_tests/test_lm_sampling.py", "parity_tests/test_lm_tasks.py",
             "parity_tests/test_cli.py::test_lm", "parity_tests/test_cli.py::test_bad_lm")
#: Per module, the test files (node-id prefixes) that do NOT run for its mutants.
MUTATION_SKIPS = {
    ("jaxgrpo.loss", "jaxgrpo.advantages", "jaxgrpo.bandit", "torchref.loss",
     "torchref.advantages", "torchref.bandit", "grpospec.checks"): (
        "scaleup/tests/", "parity_tests/test_sharding.py", "parity_tests/test_cli.py",
        "parity_tests/test_counting.py::test_jax_learns", "parity_tests/test_counting.py::"
        "test_torch_learns", "parity_tests/test_lab.py::test_grpo_learns",
        "parity_tests/test_spec_mutants.py", *_LM_TESTS),
    ("jaxgrpo.counting", "torchref.counting"): (
        "scaleup/tests/", "parity_tests/test_sharding.py", "parity_tests/test_spec_mutants.py",
        *_LM_TESTS),
    ("scaleup.",): ("parity_tests/",),
    # the LM lab's rules (grpospec.lm: vocabulary, checker, sizes, configuration), its
    # tasks on arrays (prompts, corpus, checker), its inverse-CDF sampler and its decoder:
    # judged by their own tests and the counting trainer's (which samples with the same
    # draw)
    ("jaxgrpo.lm_tasks", "torchref.lm_tasks", "jaxgrpo.sampling", "torchref.sampling",
     "jaxgrpo.qwen2", "grpospec.lm"): (
        "scaleup/tests/", "parity_tests/test_sharding.py", "parity_tests/test_spec_mutants.py"),
}


def skipped_for(mutant: str) -> tuple[str, ...]:
    """The node-id prefixes of ``MUTATION_SKIPS`` for ``mutant``'s module (a name such as
    ``jaxgrpo.loss.x_grpo_loss__mutmut_3``); ``()`` for a module it does not list."""
    for modules, skips in MUTATION_SKIPS.items():
        if any(mutant.startswith(m if m.endswith(".") else m + ".") for m in modules):
            return skips
    return ()


def _nodeid(item: Any) -> str:
    return item.nodeid.removeprefix("mutants/")


def for_mutant(items: Sequence[Any], mutant: str, durations: Mapping[str, float],
               killers: Mapping[str, str]) -> list[Any]:
    """``items`` (pytest items) less the skipped ones for ``mutant``, its recorded killer
    first, then by ``durations`` (node ids with or without ``mutants/``), unknown last."""
    skips = skipped_for(mutant)
    kept = [i for i in items if not (skips and _nodeid(i).startswith(skips))]
    killer = killers.get(mutant)
    return sorted(kept, key=lambda i: (_nodeid(i) != killer, durations.get(
        i.nodeid, durations.get("mutants/" + _nodeid(i), float("inf")))))


#: What each test costs when a mutant's run starts with it (conftest.py writes it in
#: mutmut's stats phase, inside ``mutants/``): a test's setup, call and teardown and the
#: setup of the shared fixtures it uses.
COSTS = Path("mutation-costs.json")


def durations(stats: Path = Path("mutmut-stats.json"), costs: Path = COSTS) -> dict[str, float]:
    """Each test's cost alone (``costs``), else the stats phase's duration (``stats``:
    mutmut runs inside ``mutants/``); ``{}`` before the stats phase."""
    out = {}
    if stats.is_file():
        out.update(json.loads(stats.read_text()).get("duration_by_test", {}))
    if costs.is_file():
        out.update(json.loads(costs.read_text()))
    return out


def add_costs(costs: Mapping[str, float], path: Path = COSTS) -> None:
    """Merge ``costs`` into ``path`` (mutmut reruns its stats for new tests only; the
    stats' processes (``mutation.runner.SHARDS``) merge one at a time)."""
    import fcntl

    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = json.loads(path.read_text()) if path.is_file() else {}
        merged.update(costs)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(merged, indent=0, sort_keys=True))
        os.replace(tmp, path)


#: Set (by ``mutation.full --retarget``): no recorded killer goes first, so that the
#: cheapest test that kills a mutant fails first and is recorded in its place.
RETARGET = "MUTATION_RETARGET"


@functools.cache
def recorded_killers(path: Path = Path("mutation/ledger.json")) -> dict[str, str]:
    """The ledger's test that killed each mutant; ``{}`` without a readable ledger, or
    when ``$MUTATION_RETARGET`` is set."""
    from mutation import ledger

    if os.environ.get(RETARGET):
        return {}
    try:
        return ledger.killers(ledger.read(path))
    except (OSError, ledger.LedgerError):
        return {}  # no ledger here: cheapest first, as without one
