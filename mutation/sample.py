"""A fixed-seed sample of mutmut's mutants, to measure a module's score in minutes.

    .venv/bin/mutmut run "jaxgrpo.loss.x_grpo_loss__mutmut_1"   # once, to make the mutants
    .venv/bin/mutmut run $(.venv/bin/python -m mutation.sample 0.25 jaxgrpo.loss torchref.loss)

prints the names of a share of each named module's mutants (those not judged yet, or
without tests when last run; a seeded random sample, the same on every machine for the
same mutants), for ``mutmut run``. The score of a sample estimates the module's;
``mutation.report`` counts the mutants not run as such.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from mutation.report import NO_TESTS, load


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("share", type=float, help="share of each module's mutants, in (0, 1]")
    parser.add_argument("modules", nargs="+", help="modules, e.g. jaxgrpo.loss")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--mutants", type=Path, default=Path("mutants"),
                        help="mutmut's folder (default: mutants)")
    args = parser.parse_args(argv)
    if not 0 < args.share <= 1:
        raise SystemExit(f"error: share must lie in (0, 1], got {args.share}")
    results = load(args.mutants)
    unknown = [m for m in args.modules if m not in results]
    if unknown:
        raise SystemExit(f"error: no mutants of {', '.join(unknown)} in {args.mutants}/ "
                         f"(known: {', '.join(results)})")
    rng = random.Random(args.seed)
    for module in args.modules:
        names = sorted(results[module])
        picked = rng.sample(names, max(1, round(args.share * len(names))))
        # "no tests" is judged again: new tests (or child processes reporting, see
        # conftest.py) can reach a function that none reached before
        print("\n".join(sorted(n for n in picked if results[module][n] is None
                                or results[module][n] in NO_TESTS)))


if __name__ == "__main__":
    main()
