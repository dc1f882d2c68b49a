"""Every mutant of the math that is not named equivalent, in one mutmut run.

    .venv/bin/python -m mutation.full                 # then: python -m mutation.report --record
    .venv/bin/python -m mutation.full --dry-run       # the names only, one a line

``mutmut run`` alone runs every mutant, the 210 named equivalents of
``mutation.report.EQUIVALENT`` too: each survives, so it runs every test of its
selection (16 s of wall time each on 2 cores, about an hour of a full run) to confirm
what a reviewer established and ``mutation.report --check-equivalent`` checks. This
command passes mutmut the names of all the others instead: for each function of the
modules in ``[tool.mutmut] only_mutate``, unchanged since the ledger recorded its mutant
count, its mutants by name less the named equivalents; for a function edited since, or
new, all of its mutants (``module.x_function__mutmut_*``: its equivalents must be
judged again, their numbers may have moved). Mutants already judged in ``--mutants``
are left out (a stopped run goes on where it stopped; ``--again`` runs them too).

``--retarget SECONDS`` runs again, instead, the killed mutants whose recorded killing
test costs more than SECONDS alone (``mutants/``'s stats), each with its tests cheapest
first and no recorded killer first (``mutation.selection.RETARGET``): a cheaper test
that kills it, added since, then fails first, and ``mutation.report --record`` keeps it
as the mutant's killer (a full run then tries it first).
mutmut then makes the mutants, runs its stats and clean run as always, and runs the
named ones, each in the fork server's open pytest session (``mutation.runner``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from pathlib import Path

from mutation import ledger, selection
from mutation.report import EQUIVALENT, load


def modules(pyproject: Path) -> list[str]:
    """The modules mutmut mutates: ``[tool.mutmut] only_mutate`` as module names."""
    paths = tomllib.loads(pyproject.read_text())["tool"]["mutmut"]["only_mutate"]
    return [p.removesuffix(".py").replace("/", ".") for p in paths]


def names(recorded: dict, modules: list[str], source: Path = Path("."),
          judged: frozenset[str] = frozenset()) -> list[str]:
    """The mutants to run: explicit names for the functions the ledger knows unchanged
    (less ``EQUIVALENT`` and ``judged``), a ``key__mutmut_*`` pattern for the others."""
    out = []
    for module in modules:
        for key, sha in sorted(ledger.function_hashes(module, source).items()):
            f = recorded["functions"].get(key)
            if f is None or f["sha"] != sha:
                out.append(f"{key}__mutmut_*")
                continue
            out += [n for n in (f"{key}__mutmut_{i}" for i in range(1, f["mutants"] + 1))
                    if n not in EQUIVALENT and n not in judged]
    return out


def expensive_kills(recorded: dict, costs: dict[str, float], seconds: float) -> list[str]:
    """The ledger's killed mutants whose recorded killer costs more than ``seconds``
    (``costs``: node ids, with or without ``mutants/``; an unknown cost counts as more)."""
    out = []
    for name, v in sorted(recorded["verdicts"].items()):
        test = v.get("killed_by")
        if test and costs.get(test, costs.get("mutants/" + test, float("inf"))) > seconds:
            out.append(name)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-children", type=int, default=2, help="mutmut's workers (default 2)")
    p.add_argument("--mutants", type=Path, default=Path("mutants"),
                   help="mutmut's folder, for the mutants already judged (default: mutants)")
    p.add_argument("--again", action="store_true",
                   help="also run the mutants already judged in --mutants")
    p.add_argument("--dry-run", action="store_true", help="print the names, run nothing")
    p.add_argument("--retarget", type=float, metavar="SECONDS",
                   help="run again the killed mutants whose recorded killer costs more than "
                        "SECONDS, cheapest test first (to record a cheaper killer)")
    args = p.parse_args(argv)
    if args.max_children < 1:
        raise SystemExit(f"error: --max-children must be at least 1, got {args.max_children}")
    if args.retarget is not None and not args.retarget >= 0:
        raise SystemExit(f"error: --retarget must be a number of seconds >= 0, got "
                         f"{args.retarget}")
    if not Path("pyproject.toml").is_file():
        raise SystemExit("error: run from the checkout's root (no pyproject.toml here)")
    try:
        recorded = ledger.read()
    except ledger.LedgerError as e:
        raise SystemExit(f"error: {e}") from None
    judged: set[str] = set()
    if args.mutants.is_dir() and not args.again:
        judged = {n for codes in load(args.mutants).values()
                  for n, c in codes.items() if c is not None}
    todo = names(recorded, modules(Path("pyproject.toml")), Path("."), frozenset(judged))
    if args.retarget is not None:
        costs = selection.durations(args.mutants / "mutmut-stats.json",
                                    args.mutants / selection.COSTS)
        if not costs:
            raise SystemExit(f"error: --retarget needs the tests' costs of a stats run in "
                             f"{args.mutants}/ (run mutation.full first)")
        unchanged = set(names(recorded, modules(Path("pyproject.toml")), Path(".")))
        todo = [n for n in expensive_kills(recorded, costs, args.retarget) if n in unchanged]
        os.environ[selection.RETARGET] = "1"
    if args.dry_run:
        print("\n".join(todo))
        return
    if not todo:
        print(f"nothing to run: every mutant not named equivalent is judged in {args.mutants}/ "
              "(--again to run them anyway)")
        return
    try:
        from mutation import runner
    except ImportError:
        raise SystemExit(f"error: mutmut is not installed for {sys.executable}: "
                         '.venv/bin/pip install -e ".[mutation]"') from None
    print(f"{len(todo)} names ({sum(n.endswith('*') for n in todo)} of them patterns of "
          f"edited or new functions; {len(judged)} already judged left out)", flush=True)
    runner.main(["run", "--max-children", str(args.max_children), *todo])


if __name__ == "__main__":
    main()
