"""The fast mutation check (CI's): a fixed-seed sample of the math's mutants, judged in minutes.

    .venv/bin/python -m mutation.ci                               # CI's subset
    .venv/bin/python -m mutation.ci jaxgrpo.loss --share 0.1 --seed 1

A full run judges 6,886 mutants in about four hours here (README, "Mutation testing");
this judges a seeded sample of a few modules' mutants (by default 3% of the two losses'
and the two advantage modules', 67 mutants) with a narrowed test selection (``TESTS``:
the files of the independent truths, the error messages, the kill tests and the
property tests; no trainer runs), so that CI sees a kill test deleted or weakened, or
mutmut's set-up broken, without the hours.

How: the checkout's tracked files (as they are in the working tree) are copied into a
scratch folder, whose ``pyproject.toml`` gets the narrowed ``[tool.mutmut]``
(``only_mutate``: the modules; ``pytest_add_cli_args_test_selection``: ``TESTS``; the
rest as configured); ``mutmut run NAMES`` runs there (through ``mutation.runner``, as
in ``mutation.full``; its own mutants, stats and clean run), so nothing of the
checkout, its ``mutants/`` included, is touched. The sample is
drawn from the mutants ``mutation/ledger.json`` records for functions unchanged since
(mutmut numbers a function's mutants from its source alone, so a name is the same
mutant while the hash matches): the same names on every machine for the same code.

Exit 1 when a sampled mutant that ``mutation.report.EQUIVALENT`` does not name survives
or reaches no test of the selection, when a named equivalent is killed (its name is
wrong), or when mutmut fails; the table says which and what the ledger recorded.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mutation import ledger
from mutation.report import EQUIVALENT, load, verdict

#: CI's modules: the math both frameworks share the most of.
MODULES = ("jaxgrpo.loss", "torchref.loss", "jaxgrpo.advantages", "torchref.advantages")
#: The tests that judge the sample: independent truths, messages, kill tests, properties.
TESTS = ("parity_tests/test_loss_truths.py", "parity_tests/test_advantage_truths.py",
         "parity_tests/test_errors.py", "parity_tests/test_mutant_kills.py",
         "parity_tests/test_properties.py")
SHARE = 0.03
SEED = 0


def sample_names(recorded: dict, modules: list[str], share: float, seed: int,
                 source: Path = Path(".")) -> tuple[list[str], list[str]]:
    """A seeded sample of ``share`` of each module's mutants, from the ledger's functions
    unchanged in ``source`` (at least one a module); returns the names and the functions
    left out as edited since the ledger recorded them."""
    hashes: dict[str, str] = {}
    for module in modules:
        hashes.update(ledger.function_hashes(module, source))
    names, edited = [], []
    for module in modules:
        pool = []
        for key, f in sorted(recorded["functions"].items()):
            if ledger.module_of(key) != module:
                continue
            if hashes.get(key) != f["sha"]:
                edited.append(key)
                continue
            pool += [f"{key}__mutmut_{i}" for i in range(1, f["mutants"] + 1)]
        if pool:
            names += random.Random(f"{seed}:{module}").sample(
                pool, max(1, math.ceil(share * len(pool))))
    return names, edited


def narrowed_config(pyproject: str, modules: list[str], tests: list[str]) -> str:
    """``pyproject`` (its text) with ``[tool.mutmut]`` narrowed to ``modules`` and
    ``tests``; every other option kept."""
    import tomlkit

    doc = tomlkit.parse(pyproject)
    cfg = doc["tool"]["mutmut"]
    cfg["only_mutate"] = [m.replace(".", "/") + ".py" for m in modules]
    cfg["pytest_add_cli_args_test_selection"] = list(tests)
    cfg["use_git_change_detection"] = False  # the scratch copy is not a git repository
    return tomlkit.dumps(doc)


def verdicts(names: list[str], codes: dict[str, int | None],
             recorded: dict[str, int]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Per name ``(name, verdict, the ledger's)`` and the failures' lines."""
    rows, failures = [], []
    for name in names:
        now, then = verdict(codes.get(name)), verdict(recorded.get(name))
        rows.append((name, now, then))
        if name in EQUIVALENT and now == "killed":
            failures.append(f"{name}: named equivalent in mutation/report.py, but killed: "
                            "the name is wrong, remove it")
        elif name not in EQUIVALENT and now != "killed":
            failures.append(f"{name}: {now} (the ledger: {then}): `mutmut show {name}`; "
                            "a missing test, or an equivalent to name")
    return rows, failures


def _copy_tracked(root: Path, dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=root, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = root / rel
        if src.is_file():  # a tracked file deleted in the working tree is left out
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", default=list(MODULES),
                   help=f"modules to sample (default: {' '.join(MODULES)})")
    p.add_argument("--share", type=float, default=SHARE,
                   help=f"share of each module's mutants, in (0, 1] (default {SHARE})")
    p.add_argument("--seed", type=int, default=SEED, help=f"seed of the sample (default {SEED})")
    p.add_argument("--tests", nargs="+", default=list(TESTS),
                   help="the test files that judge the sample (default: TESTS)")
    p.add_argument("--max-children", type=int, default=2,
                   help="mutmut's workers (default 2)")
    p.add_argument("--keep", action="store_true",
                   help="keep the scratch folder (its path is printed) to inspect mutants")
    args = p.parse_args(argv)
    if not 0 < args.share <= 1:
        raise SystemExit(f"error: --share must lie in (0, 1], got {args.share}")
    if args.max_children < 1:
        raise SystemExit(f"error: --max-children must be at least 1, got {args.max_children}")
    root = Path(__file__).resolve().parent.parent
    unknown = [t for t in args.tests if not (root / t).exists()]
    if unknown:
        raise SystemExit(f"error: --tests: no such test file in {root}: {', '.join(unknown)}")
    try:
        recorded = ledger.read(root / "mutation" / "ledger.json")
    except ledger.LedgerError as e:
        raise SystemExit(f"error: {e}") from None
    known = {ledger.module_of(k) for k in recorded["functions"]}
    bad = [m for m in args.modules if m not in known]
    if bad:
        raise SystemExit(f"error: modules: {', '.join(bad)} not in the ledger (expected some "
                         f"of {', '.join(sorted(known))})")
    names, edited = sample_names(recorded, args.modules, args.share, args.seed, root)
    if edited:
        print(f"left out, edited since the ledger recorded them: {', '.join(edited)}")
    if not names:
        raise SystemExit("error: no mutant to sample: every function of the modules was "
                         "edited since the ledger recorded it (run the full mutation command)")
    try:
        from mutation import runner  # mutmut's, warm: run below in a subprocess
    except ImportError:
        raise SystemExit(f"error: mutmut is not installed for {sys.executable}: "
                         '.venv/bin/pip install -e ".[mutation]"') from None
    scratch = Path(tempfile.mkdtemp(prefix="jaxgrpo-mutation-ci-"))
    try:
        _copy_tracked(root, scratch)
        pyproject = scratch / "pyproject.toml"
        pyproject.write_text(narrowed_config(pyproject.read_text(), args.modules, args.tests))
        print(f"{len(names)} mutants of {', '.join(args.modules)} (share {args.share}, seed "
              f"{args.seed}), judged by {' '.join(args.tests)}; scratch copy {scratch}",
              flush=True)
        start = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "mutation.runner", "run", "--max-children",
                              str(args.max_children), *names], cwd=scratch,
                             env=os.environ | {"TERM": "dumb"}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        elapsed = time.monotonic() - start
        if run.returncode != 0:
            print(run.stdout[-4000:])
            raise SystemExit(f"error: mutmut run failed with exit code {run.returncode} "
                             f"(its output above; scratch copy {scratch})")
        if runner.NO_WARM_SESSION in run.stdout:  # it still ran, one pytest start a mutant
            print(run.stdout[-4000:])
            raise SystemExit("error: mutation.runner could not open its pytest session (its "
                             "output above): `mutation.full` would run at the old speed")
        codes = {n: c for module in load(scratch / "mutants", scratch).values()
                 for n, c in module.items()}
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    before, _ = ledger.fresh(recorded, root)
    rows, failures = verdicts(names, codes, before)
    print("| mutant | verdict | the ledger's | named equivalent |\n|---|---|---|---|")
    for name, now, then in rows:
        print(f"| `{name}` | {now} | {then} | {'yes' if name in EQUIVALENT else ''} |")
    killed = sum(now == "killed" for _, now, _ in rows)
    print(f"\n{killed} of {len(names)} killed, {sum(n in EQUIVALENT for n in names)} named "
          f"equivalent, in {elapsed / 60:.1f} minutes (mutmut's stats and clean run included)")
    for line in failures:
        print(f"FAIL {line}")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
