"""A fixed-seed sample of mutmut's mutants, to measure a module's score in minutes.

    .venv/bin/mutmut run "jaxgrpo.loss.x_grpo_loss__mutmut_1"   # once, to make the mutants
    .venv/bin/mutmut run $(.venv/bin/python -m mutation.sample 0.25 jaxgrpo.loss torchref.loss)

prints the names of a share of each named module's mutants, drawn from those not judged
yet (neither in ``mutants/`` nor, still valid, in ``mutation/ledger.json``) or without
tests when last run: a seeded random sample, the same on every machine for the same
mutants and ledger, for ``mutmut run``. So successive samples, recorded with
``mutation.report --record``, cover new mutants until every one is judged. The score of
a sample estimates the module's; ``mutation.report`` counts the mutants not run as such.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from mutation import ledger
from mutation.report import NO_TESTS, load


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("share", type=float, help="share of each module's mutants, in (0, 1]")
    parser.add_argument("modules", nargs="+", help="modules, e.g. jaxgrpo.loss")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--mutants", type=Path, default=Path("mutants"),
                        help="mutmut's folder (default: mutants)")
    parser.add_argument("--ledger", type=Path, default=ledger.LEDGER,
                        help="the committed record of verdicts (default: mutation/ledger.json)")
    args = parser.parse_args(argv)
    if not 0 < args.share <= 1:
        raise SystemExit(f"error: share must lie in (0, 1], got {args.share}")
    if not args.mutants.is_dir():
        raise SystemExit(f"error: --mutants {args.mutants} is not a folder: make the mutants "
                         'first, `.venv/bin/mutmut run "jaxgrpo.loss.x_grpo_loss__mutmut_1"`')
    results = load(args.mutants)
    unknown = [m for m in args.modules if m not in results]
    if unknown:
        raise SystemExit(f"error: no mutants of {', '.join(unknown)} in {args.mutants}/ "
                         f"(known: {', '.join(results)})")
    try:
        valid, _ = ledger.fresh(ledger.read(args.ledger))
    except ledger.LedgerError as e:
        raise SystemExit(f"error: --ledger: {e}") from None
    rng = random.Random(args.seed)
    for module in args.modules:
        codes = results[module]
        # "no tests" is judged again: new tests (or child processes reporting, see
        # conftest.py) can reach a function that none reached before
        verdicts = {n: valid.get(n) if c is None else c for n, c in codes.items()}
        open_ = sorted(n for n, c in verdicts.items() if c is None or c in NO_TESTS)
        picked = rng.sample(open_, min(len(open_), max(1, round(args.share * len(codes)))))
        if picked:
            print("\n".join(sorted(picked)))


if __name__ == "__main__":
    main()
