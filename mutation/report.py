"""The mutation score per module, from mutmut's results (``mutants/**/*.py.meta``).

    .venv/bin/mutmut run                      # all mutants (README, "Mutation testing")
    .venv/bin/python -m mutation.report       # the table, then the surviving mutants

Per module: the mutants mutmut made, how many the suite killed (a failing test, or a
timeout: a mutant that makes the suite hang is caught), how many survived, how many no
test reaches, how many were not run yet, the mutants named equivalent in
``EQUIVALENT`` (a mutation that cannot change any result, with the reason), and the
score ``killed / (total - equivalent - not run)``. Then every survivor that is not named
equivalent: the known gaps (``mutmut show NAME`` prints its diff).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

#: Mutants that cannot change any result, each with the reason (checked by reading the
#: diff: ``mutmut show NAME``). A name here that mutmut no longer makes is reported.
EQUIVALENT: dict[str, str] = {
    "scaleup.tasks.x_load_gsm8k__mutmut_9": "encoding 'UTF-8' is 'utf-8'",
    "scaleup.tasks.x_question_key__mutmut_3": "upper() instead of lower(): the same "
    "question keys compare equal (both sides normalised alike)",
    "scaleup.tasks.xǁDatasetTaskǁsample__mutmut_16": "replace=None is falsy: the same "
    "sampling without replacement",
    "torchref.loss.x_grpo_loss__mutmut_163": "SAPO's temperature at A = 0 (> vs >=): the "
    "term is multiplied by A = 0, value and gradient",
    "jaxgrpo.loss.x__grpo_loss__mutmut_146": "the fill value of masked positions of the "
    "TIS gap: they are masked again before use",
}

KILLED = {1, 3, 36, 24, -24, 152, 255}  # a failing test, or a timeout
SURVIVED = {0}
NO_TESTS = {5, 33}


def load(root: Path = Path("mutants"), source: Path | None = Path(".")
         ) -> dict[str, dict[str, int | None]]:
    """``{module: {mutant name: exit code or None}}`` from mutmut's meta files; with
    ``source``, the mutants of functions no longer in the source tree are left out (code
    removed since mutmut made them)."""
    out: dict[str, dict[str, int | None]] = {}
    for meta in sorted(root.rglob("*.py.meta")):
        rel = meta.relative_to(root).with_suffix("").with_suffix("")
        module = ".".join(rel.parts)
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if source is not None and (source / rel.with_suffix(".py")).is_file():
            text = (source / rel.with_suffix(".py")).read_text()
            codes = {n: c for n, c in codes.items() if f"def {_function(module, n)}(" in text}
        out[module] = codes
    return out


def _function(module: str, mutant: str) -> str:
    """The function a mutant name points at: ``m.x_name__mutmut_3`` -> ``name``;
    ``m.xǁClassǁmethod__mutmut_3`` -> ``method``."""
    name = mutant[len(module) + 1:].rsplit("__mutmut_", 1)[0]
    return name.split("ǁ")[-1] if "ǁ" in name else name.removeprefix("x_")


def table(results: dict[str, dict[str, int | None]]) -> tuple[str, list[str]]:
    """The markdown table and the names of the survivors not named equivalent."""
    rows = ["| module | mutants | killed | survived | no tests | not run | equivalent "
            "| score |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    gaps = []
    total = defaultdict(int)
    for module, codes in results.items():
        c = defaultdict(int)
        for name, code in codes.items():
            if name in EQUIVALENT:
                c["equivalent"] += 1
            elif code is None:
                c["not run"] += 1
            elif code in KILLED:
                c["killed"] += 1
            elif code in SURVIVED:
                c["survived"] += 1
                gaps.append(name)
            elif code in NO_TESTS:
                c["no tests"] += 1
                gaps.append(name)
            else:
                c["other"] += 1
                gaps.append(name)
        c["mutants"] = len(codes)
        judged = c["mutants"] - c["equivalent"] - c["not run"]
        score = f"{100 * c['killed'] / judged:.1f}%" if judged else "n/a"
        rows.append(f"| `{module}` | {c['mutants']} | {c['killed']} | {c['survived']} | "
                    f"{c['no tests']} | {c['not run']} | {c['equivalent']} | {score} |")
        for k, v in c.items():
            total[k] += v
    return "\n".join(rows), gaps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=Path, default=Path("mutants"),
                        help="mutmut's folder (default: mutants)")
    args = parser.parse_args(argv)
    if not args.mutants.is_dir():
        raise SystemExit(f"error: --mutants {args.mutants} is not a folder: run "
                         "`.venv/bin/mutmut run` first")
    results = load(args.mutants)
    text, gaps = table(results)
    print(text)
    known = {n for codes in results.values() for n in codes}
    stale = sorted(set(EQUIVALENT) - known)
    if stale:
        print(f"\nnamed equivalent but no longer made by mutmut: {', '.join(stale)}")
    print(f"\n{len(gaps)} surviving mutants not named equivalent (mutmut show NAME):")
    for name in gaps:
        print(f"  {name}")


if __name__ == "__main__":
    main()
