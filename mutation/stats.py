"""Give a new function the tests of its callers in mutmut's stats.

mutmut 3.8 maps tests to the functions they reach once, in its stats run, and afterwards
runs the stats again only for *new tests*. A function added later (e.g. a check pulled
out of two callers into one helper) is then mapped to the new tests alone, although
every old test of its callers reaches it too: its mutants run against too few tests
and may survive falsely (a kill is never false: a test only fails for a mutant that it
reaches). mutmut does record, for the new tests, which function called which
(``function_dependencies``: callee -> callers), so this adds to each callee the tests of
its callers, transitively, for the functions named (all callees would give most
functions tests that never reach them: extra tests cost time only, but much of it).

    .venv/bin/python -m mutation.stats jaxgrpo.bandit.x__check_baseline   # in place
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path


def fill_callee_tests(stats: dict, functions: list[str]) -> dict[str, int]:
    """Add to each of ``functions`` the tests of its callers, and of their callers
    (transitively), in place; returns ``{function: tests added}`` for those that gained
    any. A name mutmut's stats do not know raises ``KeyError`` naming it."""
    tests = stats.setdefault("tests_by_mangled_function_name", {})
    deps = stats.get("function_dependencies", {})
    added: dict[str, int] = {}
    for f in functions:
        if f not in tests and f not in deps:
            raise KeyError(f"{f!r} is not a function in mutmut's stats")
        seen, todo, reached = {f}, list(deps.get(f, [])), set()
        while todo:  # callers of callers
            c = todo.pop()
            if c in seen:
                continue
            seen.add(c)
            reached |= set(tests.get(c, []))
            todo += deps.get(c, [])
        have = set(tests.get(f, []))
        if reached - have:
            tests[f] = sorted(have | reached)
            added[f] = len(reached - have)
    return added


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("functions", nargs="+",
                   help="mutmut's function keys, e.g. jaxgrpo.bandit.x__check_baseline")
    p.add_argument("--stats", type=Path, default=Path("mutants/mutmut-stats.json"),
                   help="mutmut's stats file (default: mutants/mutmut-stats.json)")
    args = p.parse_args(argv)
    if not args.stats.is_file():
        raise SystemExit(f"--stats: {args.stats} does not exist (run mutmut once first)")
    try:
        stats = json.loads(args.stats.read_text())
    except json.JSONDecodeError as e:
        raise SystemExit(f"--stats: {args.stats} is not valid JSON ({e.msg})") from None
    if not isinstance(stats, dict) or not isinstance(
            stats.get("tests_by_mangled_function_name", {}), dict):
        raise SystemExit(f"--stats: {args.stats} is not mutmut's stats file")
    try:
        added = fill_callee_tests(stats, args.functions)
    except KeyError as e:
        raise SystemExit(f"functions: {e.args[0]}") from None
    fd, tmp = tempfile.mkstemp(dir=args.stats.parent, prefix=".stats-")
    with os.fdopen(fd, "w") as f:
        json.dump(stats, f)
    os.replace(tmp, args.stats)
    for callee, n in sorted(added.items()):
        print(f"{callee}: +{n} tests of its callers")
    print(f"{len(added)} functions gained tests")


if __name__ == "__main__":
    main()
