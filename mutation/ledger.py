"""The record of mutmut's verdicts, kept in the repository so that runs add up.

A full mutmut run of the math takes many hours on 2 cores (README, "Mutation testing"),
and ``mutants/`` is a build folder: it is lost with the machine. So each sample's
verdicts are recorded here, in ``mutation/ledger.json``, with what makes them valid:

* ``functions``: for each mutated function (``module.x_name`` or ``module.xǁClassǁname``,
  mutmut's keys), the SHA-256 of its source as it was when recorded and how many
  mutants mutmut made of it. mutmut makes a function's mutants from that source alone,
  so while the hash matches today's source, a recorded name is still the same mutant.
* ``verdicts``: ``{mutant name: {"code": mutmut's exit code, "date", "commit"}}``: when
  and on which checkout (``+dirty``: with uncommitted changes) the verdict was first
  recorded; recording the same verdict again keeps them. A kill also names, when
  mutmut's run recorded it (``kills.tsv``, written by the root ``conftest.py``), the
  test that failed first (``"killed_by"``): later runs try that test first (a hint for
  the order only: a mutant is still judged by all of its tests until one fails).

A verdict whose function has been edited since (its hash differs) is stale: it is not
counted, and recording that function again drops its old verdicts (they were of other
code). A new test can only kill more; a test removed can make a recorded kill wrong,
which is why each verdict names the commit it was measured on.

    .venv/bin/python -m mutation.report --record   # add mutants/'s verdicts to the ledger
    .venv/bin/python -m mutation.report            # the table, from mutants/ and the ledger
"""

from __future__ import annotations

import ast
import datetime as dt
import fcntl
import hashlib
import json
import os
import subprocess
import tempfile
from collections import defaultdict
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

LEDGER = Path(__file__).with_name("ledger.json")
VERSION = 1
# mutmut's exit codes of a mutant (mutation.report.verdict puts them in words)
KILLED = {1, 3, 36, 24, -24, 152, 255}  # a failing test, or a timeout
SURVIVED = {0}
NO_TESTS = {5, 33}


class LedgerError(Exception):
    """The ledger file is damaged or of another format (the message says which)."""


def function_key(mutant: str) -> str:
    """``m.x_f__mutmut_3`` -> ``m.x_f`` (the function a mutant belongs to)."""
    key, sep, number = mutant.rpartition("__mutmut_")
    if not sep or not number.isdigit():
        raise ValueError(f"not a mutmut mutant name: {mutant!r}")
    return key


def module_of(key: str) -> str:
    """``pkg.mod.x_f`` or ``pkg.mod.xǁCǁm`` (a function key or mutant name) -> ``pkg.mod``."""
    return key.split(".xǁ", 1)[0] if ".xǁ" in key else key.split(".x_", 1)[0]


def function_hashes(module: str, source: Path = Path(".")) -> dict[str, str]:
    """``{mutmut key: SHA-256 of the function's source}`` for every top-level function
    and method of ``module`` (decorators included: mutmut's mutants of a function depend
    on its text only)."""
    path = source / (module.replace(".", "/") + ".py")
    if not path.is_file():
        return {}
    text = path.read_text()
    lines = text.splitlines(keepends=True)

    def digest(node: ast.AST) -> str:
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        return hashlib.sha256("".join(lines[first - 1:node.end_lineno]).encode()).hexdigest()

    out = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out[f"{module}.x_{node.name}"] = digest(node)
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    out[f"{module}.xǁ{node.name}ǁ{sub.name}"] = digest(sub)
    return out


def empty() -> dict:
    return {"version": VERSION, "functions": {}, "verdicts": {}}


def read(path: Path = LEDGER) -> dict:
    """The ledger (an empty one if the file does not exist); a damaged file raises
    ``LedgerError`` naming it."""
    if not path.exists():
        return empty()
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LedgerError(f"{path} is not valid JSON ({e}): restore it with "
                          f"`git checkout {path}`") from None
    if not _well_formed(data):
        raise LedgerError(f"{path} is not a mutation ledger of version {VERSION} (expected "
                          '{"version": 1, "functions": {key: {"sha", "mutants"}}, '
                          '"verdicts": {mutant: {"code", ...}}}, each verdict\'s function '
                          "recorded): restore it with `git checkout` of that file")
    return data


def _well_formed(data) -> bool:
    if not (isinstance(data, dict) and data.get("version") == VERSION
            and isinstance(data.get("functions"), dict)
            and isinstance(data.get("verdicts"), dict)):
        return False
    for f in data["functions"].values():
        if not (isinstance(f, dict) and isinstance(f.get("sha"), str)
                and type(f.get("mutants")) is int and f["mutants"] >= 0):
            return False
    for name, v in data["verdicts"].items():
        try:
            known = function_key(name) in data["functions"]
        except ValueError:
            return False
        if not (known and isinstance(v, dict) and type(v.get("code")) is int
                and isinstance(v.get("killed_by", ""), str)):
            return False
    return True


def fresh(ledger: Mapping, source: Path = Path(".")) -> tuple[dict[str, int], set[str]]:
    """The verdicts still valid for today's ``source`` (``{name: code}``) and the
    recorded functions edited or removed since."""
    hashes: dict[str, str] = {}
    for module in {module_of(k) for k in ledger["functions"]}:
        hashes.update(function_hashes(module, source))
    changed = {k for k, f in ledger["functions"].items() if hashes.get(k) != f["sha"]}
    return ({n: v["code"] for n, v in ledger["verdicts"].items()
             if function_key(n) not in changed}, changed)


def merge(ledger: Mapping, results: Mapping[str, Mapping[str, int | None]],
          source: Path = Path("."), *, date: str, commit: str,
          killers: Mapping[str, str] | None = None) -> tuple[dict, int]:
    """A new ledger: ``ledger`` plus the judged mutants of ``results`` (mutation.report's
    ``{module: {name: code or None}}``, from ``mutants/``); returns it and how many
    verdicts were added or changed. Every function of ``results`` is recorded with its
    hash and mutant count; a function whose hash changed loses its old verdicts.
    ``killers`` (``{name: test}``, from ``read_kills``) names the test that killed a
    mutant; it is kept with the verdict of a killed mutant only."""
    killers = killers or {}
    out = {"version": VERSION, "functions": dict(ledger["functions"]),
           "verdicts": dict(ledger["verdicts"])}
    per_function: dict[str, list[str]] = defaultdict(list)
    for codes in results.values():
        for name in codes:
            per_function[function_key(name)].append(name)
    hashes: dict[str, str] = {}
    for module in results:
        hashes.update(function_hashes(module, source))
    changed = 0
    for key, names in per_function.items():
        if key not in hashes:
            continue  # removed from the source since mutmut made its mutants
        old = out["functions"].get(key)
        if old is not None and old["sha"] != hashes[key]:
            for name in [n for n in out["verdicts"] if function_key(n) == key]:
                del out["verdicts"][name]
        out["functions"][key] = {"sha": hashes[key], "mutants": len(names)}
    for codes in results.values():
        for name, code in codes.items():
            if code is None or function_key(name) not in hashes:
                continue
            old = out["verdicts"].get(name, {})
            killer = killers.get(name) if code in KILLED else None
            if old.get("code") == code:
                # the same verdict: keep when and where it was first measured
                if killer and old.get("killed_by") != killer:
                    out["verdicts"][name] = {**old, "killed_by": killer}
                continue
            changed += 1
            out["verdicts"][name] = {"code": code, "date": date, "commit": commit,
                                     **({"killed_by": killer} if killer else {})}
    out["verdicts"] = dict(sorted(out["verdicts"].items()))
    out["functions"] = dict(sorted(out["functions"].items()))
    return out, changed


def overlay(ledger: Mapping, results: Mapping[str, Mapping[str, int | None]],
            source: Path = Path(".")) -> tuple[dict[str, dict[str, int | None]], set[str]]:
    """mutation.report's ``{module: {name: code or None}}``: ``results`` (from
    ``mutants/``, may be empty) with its unjudged mutants filled from the ledger's fresh
    verdicts, and, for modules ``results`` lacks, the ledger's own functions (names
    ``key__mutmut_1..n``); also the recorded functions edited since (left out)."""
    valid, changed = fresh(ledger, source)
    out = {m: dict(codes) for m, codes in results.items()}
    for codes in out.values():
        for name, code in codes.items():
            if code is None and name in valid:
                codes[name] = valid[name]
    for key, f in ledger["functions"].items():
        module = module_of(key)
        if module in results or key in changed:
            continue
        codes = out.setdefault(module, {})
        for i in range(1, f["mutants"] + 1):
            codes[f"{key}__mutmut_{i}"] = valid.get(f"{key}__mutmut_{i}")
    return {m: out[m] for m in sorted(out)}, changed


def read_kills(path: Path) -> dict[str, str]:
    """``{mutant name: the test that failed first}`` from the root ``conftest.py``'s
    ``kills.tsv`` (lines ``mutant<TAB>test<TAB>seconds``; a mutant run again: its last
    line). Raises ``LedgerError`` naming the first malformed line."""
    out: dict[str, str] = {}
    for i, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.split("\t")
        try:
            ok = len(parts) == 3 and "__mutmut_" in parts[0] and parts[1] and float(parts[2]) >= 0
        except ValueError:
            ok = False
        if not ok:
            raise LedgerError(f"{path}, line {i}: expected 'mutant<TAB>test<TAB>seconds', got "
                              f"{line[:80]!r}: delete the file or that line")
        out[parts[0]] = parts[1]
    return out


def killers(ledger: Mapping) -> dict[str, str]:
    """``{mutant name: the test that killed it}``, for the recorded kills that name it
    (any function version: only an order hint, see the module's docstring)."""
    return {n: v["killed_by"] for n, v in ledger["verdicts"].items() if "killed_by" in v}


def head_commit(source: Path = Path(".")) -> str:
    """The checked-out commit, ``+dirty`` when the tree has uncommitted changes (the
    tests that judged a mutant may be newer than the commit)."""
    try:
        run = [subprocess.run(["git", *cmd], cwd=source, capture_output=True, text=True,
                              check=True).stdout.strip()
               for cmd in (["rev-parse", "--short", "HEAD"],
                           ["status", "--porcelain", "--untracked-files=no"])]
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return run[0] + ("+dirty" if run[1] else "")


@contextmanager
def _locked(path: Path):
    """Holds an exclusive lock beside ``path``: two recordings started at once are
    applied one after the other, neither loses the other's verdicts."""
    lock = path.with_name(path.name + ".lock")
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def record(results: Mapping[str, Mapping[str, int | None]], path: Path = LEDGER,
           source: Path = Path("."), killers: Mapping[str, str] | None = None) -> int:
    """Adds ``results``' verdicts (and ``killers``, see ``merge``) to the ledger file
    (read, merged and replaced under a lock, written to a temporary file first); returns
    how many were added or changed."""
    with _locked(path):
        new, changed = merge(read(path), results, source, date=dt.date.today().isoformat(),
                             commit=head_commit(source), killers=killers)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(new, f, indent=0, ensure_ascii=False)
                f.write("\n")
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # as any file written here, not mkstemp's 0600
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return changed
