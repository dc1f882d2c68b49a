"""The mutation ledger (``mutation/ledger.py``): verdicts add up across runs, an edited
function's verdicts stop counting, the committed ledger is valid for today's code, and a
damaged file is reported in one line. No mutmut needed: results are built by hand."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest

from mutation import ledger, report, sample

SRC = '''\
def f(x):
    return x + 1


class C:
    def m(self):
        return 2
'''


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(SRC)
    return tmp_path


def _results(**codes):
    names = {"f": "pkg.mod.x_f__mutmut_", "m": "pkg.mod.xǁCǁm__mutmut_"}
    return {"pkg.mod": {names[k[0]] + k[1:]: c for k, c in codes.items()}}


def test_keys_and_hashes_follow_mutmut_names(tree: Path):
    assert ledger.function_key("pkg.mod.xǁCǁm__mutmut_12") == "pkg.mod.xǁCǁm"
    assert ledger.module_of("pkg.mod.xǁCǁm") == "pkg.mod"
    assert ledger.module_of("pkg.mod.x_x_f") == "pkg.mod"
    with pytest.raises(ValueError, match="not a mutmut mutant name"):
        ledger.function_key("pkg.mod.x_f")
    h = ledger.function_hashes("pkg.mod", tree)
    assert set(h) == {"pkg.mod.x_f", "pkg.mod.xǁCǁm"}
    (tree / "pkg" / "mod.py").write_text(SRC.replace("x + 1", "x + 2"))
    h2 = ledger.function_hashes("pkg.mod", tree)
    assert h2["pkg.mod.x_f"] != h["pkg.mod.x_f"] and h2["pkg.mod.xǁCǁm"] == h["pkg.mod.xǁCǁm"]


def test_runs_add_up_and_an_edit_voids_only_its_function(tree: Path):
    path = tree / "ledger.json"
    # run 1 judges f's mutants 1 and 2 and m's 1; run 2 (a new mutants/) judges f's 3
    assert ledger.record(_results(f1=1, f2=0, f3=None, m1=1), path, tree) == 3
    assert ledger.record(_results(f1=None, f2=None, f3=1, m1=None), path, tree) == 1
    stamp = ledger.read(path)["verdicts"]["pkg.mod.x_f__mutmut_1"]
    assert ledger.record(_results(f1=1, f2=None, f3=None, m1=None), path, tree) == 0
    assert ledger.read(path)["verdicts"]["pkg.mod.x_f__mutmut_1"] == stamp  # kept as first made
    data = ledger.read(path)
    assert {n: v["code"] for n, v in data["verdicts"].items()} == {
        "pkg.mod.x_f__mutmut_1": 1, "pkg.mod.x_f__mutmut_2": 0,
        "pkg.mod.x_f__mutmut_3": 1, "pkg.mod.xǁCǁm__mutmut_1": 1}
    assert data["functions"]["pkg.mod.x_f"]["mutants"] == 3
    # on a fresh clone (no mutants/) the table is the ledger's
    results, changed = ledger.overlay(data, {}, tree)
    assert changed == set()
    text, gaps = report.table(results)
    assert "| `pkg.mod` | 4 | 3 | 1 | 0 | 0 | 0 | 75.0% |" in text
    assert gaps == ["pkg.mod.x_f__mutmut_2"]
    # a survivor killed in a later run is updated, not counted twice
    assert ledger.record(_results(f1=None, f2=1, f3=None, m1=None), path, tree) == 1
    # f is edited: its verdicts stop counting, m's still count
    (tree / "pkg" / "mod.py").write_text(SRC.replace("x + 1", "x - 1"))
    results, changed = ledger.overlay(ledger.read(path), {}, tree)
    assert changed == {"pkg.mod.x_f"}
    assert results == {"pkg.mod": {"pkg.mod.xǁCǁm__mutmut_1": 1}}
    # recording f again (new mutants) drops its old verdicts
    ledger.record(_results(f1=0, f2=None), path, tree)
    data = ledger.read(path)
    assert [n for n in data["verdicts"] if "x_f" in n] == ["pkg.mod.x_f__mutmut_1"]
    assert data["verdicts"]["pkg.mod.x_f__mutmut_1"]["code"] == 0
    assert data["functions"]["pkg.mod.x_f"]["mutants"] == 2


def test_mutants_folder_wins_and_the_ledger_fills_its_gaps(tree: Path):
    path = tree / "ledger.json"
    ledger.record(_results(f1=0, f2=1), path, tree)
    results, _ = ledger.overlay(ledger.read(path), _results(f1=1, f2=None, f3=None), tree)
    assert results["pkg.mod"] == {"pkg.mod.x_f__mutmut_1": 1, "pkg.mod.x_f__mutmut_2": 1,
                                  "pkg.mod.x_f__mutmut_3": None}


def _record_some(args):
    tree, first = args
    for number in range(first, first + 10):  # one verdict at a time: many read-merge-writes
        ledger.record(_results(**{f"f{number}": 1}), Path(tree) / "ledger.json", Path(tree))


def test_recordings_at_the_same_moment_keep_every_verdict(tree: Path):
    """Four processes record 10 verdicts each, one at a time, into one ledger: all 40
    are kept (without the lock, read-merge-write races lose some)."""
    with mp.get_context("spawn").Pool(4) as pool:
        pool.map(_record_some, [(str(tree), 1 + 10 * i) for i in range(4)])
    assert len(ledger.read(tree / "ledger.json")["verdicts"]) == 40
    assert [p.name for p in tree.iterdir() if p.name.startswith("ledger.json.")] == [
        "ledger.json.lock"]  # no temporary file left behind


@pytest.mark.parametrize("text, message", [
    ("{not json", "is not valid JSON"),
    (json.dumps({"version": 1, "functions": {}, "verdicts": {"a.x_f__mutmut_1": {"code": 1}}}),
     "is not a mutation ledger"),
    (json.dumps({"version": 2, "functions": {}, "verdicts": {}}), "is not a mutation ledger"),
    (json.dumps({"version": 1, "functions": {"a.x_f": {"sha": "0", "mutants": "3"}},
                 "verdicts": {}}), "is not a mutation ledger"),
])
def test_a_damaged_ledger_is_one_line_naming_the_option(tree: Path, text, message, capsys):
    (tree / "ledger.json").write_text(text)
    with pytest.raises(SystemExit) as e:
        report.main(["--ledger", str(tree / "ledger.json"), "--mutants", str(tree / "none")])
    assert str(e.value).startswith(f"error: --ledger: {tree / 'ledger.json'} {message}")
    assert "\n" not in str(e.value)


def test_sample_draws_only_what_is_not_judged(tree: Path, monkeypatch, capsys):
    path = tree / "ledger.json"
    monkeypatch.chdir(tree)
    ledger.record(_results(f1=1, f2=0, m1=5), path, tree)
    monkeypatch.setattr(sample, "load", lambda root: _results(
        f1=None, f2=None, f3=None, f4=None, m1=None))
    monkeypatch.setattr(ledger, "LEDGER", path)
    with pytest.raises(SystemExit, match="--mutants mutants is not a folder: make the mutants"):
        sample.main(["1.0", "pkg.mod", "--ledger", str(path)])
    (tree / "mutants").mkdir()
    sample.main(["1.0", "pkg.mod", "--ledger", str(path)])
    # f1, f2 judged in the ledger; m1's "no tests" is drawn again
    assert capsys.readouterr().out.split() == [
        "pkg.mod.x_f__mutmut_3", "pkg.mod.x_f__mutmut_4", "pkg.mod.xǁCǁm__mutmut_1"]


def test_the_committed_ledger_reads_and_its_table_adds_up():
    data = ledger.read()
    valid, changed = ledger.fresh(data)
    results, _ = ledger.overlay(data, {})
    for module, codes in results.items():
        assert all(c is None or c == valid[n] for n, c in codes.items()), module
    recorded = {ledger.function_key(n) for n in data["verdicts"]}
    assert recorded <= set(data["functions"])


def test_record_refuses_mutants_older_than_their_source(tree: Path, monkeypatch):
    """A module edited after mutmut made its mutants: its verdicts may be of older code,
    so --record stops with one line naming it (and records once mutmut has run again)."""
    monkeypatch.chdir(tree)
    made = tree / "mutants" / "pkg"
    made.mkdir(parents=True)
    (made / "mod.py").write_text(SRC)
    (made / "mod.py.meta").write_text(json.dumps(
        {"exit_code_by_key": {"pkg.mod.x_f__mutmut_1": 1}}))
    os.utime(made / "mod.py", (1_000_000_000, 1_000_000_000))  # made long ago
    with pytest.raises(SystemExit) as e:
        report.main(["--record", "--ledger", "ledger.json"])
    assert str(e.value).startswith("error: --record: pkg/mod.py changed since mutmut made")
    assert not (tree / "ledger.json").exists()
    os.utime(made / "mod.py")  # mutmut ran again: now newer than the source
    report.main(["--record", "--ledger", "ledger.json"])
    assert ledger.read(tree / "ledger.json")["verdicts"]["pkg.mod.x_f__mutmut_1"]["code"] == 1


def test_stats_fill_gives_a_new_callee_its_callers_tests_transitively():
    """mutation.stats: a helper reached through callers (and a helper of that helper)
    gets every caller's tests; functions not named are untouched."""
    from mutation.stats import fill_callee_tests

    stats = {"tests_by_mangled_function_name": {"m.x_a": ["t1", "t2"], "m.x_b": ["t3"],
                                                "m.x_helper": ["t9"]},
             "function_dependencies": {"m.x_helper": ["m.x_a", "m.x_b"],
                                       "m.x_inner": ["m.x_helper"]}}
    assert fill_callee_tests(stats, ["m.x_inner"]) == {"m.x_inner": 4}
    tests = stats["tests_by_mangled_function_name"]
    assert tests["m.x_inner"] == ["t1", "t2", "t3", "t9"]
    assert tests["m.x_helper"] == ["t9"]  # not named: untouched
    assert fill_callee_tests(stats, ["m.x_helper"]) == {"m.x_helper": 3}
    assert tests["m.x_helper"] == ["t1", "t2", "t3", "t9"]
    assert tests["m.x_a"] == ["t1", "t2"] and tests["m.x_b"] == ["t3"]
    assert fill_callee_tests(stats, ["m.x_helper", "m.x_inner"]) == {}
    with pytest.raises(KeyError, match="'m.x_nope' is not a function in mutmut's stats"):
        fill_callee_tests(stats, ["m.x_nope"])


def test_stats_fill_reports_a_missing_or_damaged_file_in_one_line(tmp_path, capsys):
    from mutation.stats import main

    with pytest.raises(SystemExit, match=r"^--stats: .*nope.json does not exist"):
        main(["b", "--stats", str(tmp_path / "nope.json")])
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(SystemExit, match=r"^--stats: .*bad.json is not valid JSON"):
        main(["b", "--stats", str(bad)])
    bad.write_text("[]")
    with pytest.raises(SystemExit, match=r"is not mutmut's stats file$"):
        main(["b", "--stats", str(bad)])
    good = tmp_path / "s.json"
    good.write_text(json.dumps({"tests_by_mangled_function_name": {"a": ["t"]},
                                "function_dependencies": {"b": ["a"]}}))
    with pytest.raises(SystemExit, match=r"^functions: 'c' is not a function"):
        main(["c", "--stats", str(good)])
    main(["b", "--stats", str(good)])
    assert json.loads(good.read_text())["tests_by_mangled_function_name"]["b"] == ["t"]
    assert capsys.readouterr().out.endswith("1 functions gained tests\n")


def test_ci_sample_is_seeded_per_module_and_leaves_out_edited_functions(tree: Path):
    """mutation.ci: the same names for the same ledger and seed, ceil(share * pool) of a
    module's recorded mutants, none of a function edited since it was recorded."""
    from mutation.ci import sample_names

    path = tree / "ledger.json"
    ledger.record(_results(**{f"f{i}": 1 for i in range(1, 11)}, m1=1, m2=0), path, tree)
    data = ledger.read(path)
    names, edited = sample_names(data, ["pkg.mod"], 0.25, 7, tree)
    assert edited == [] and len(names) == 3 and len(set(names)) == 3  # ceil(0.25 * 12)
    pool = {f"pkg.mod.x_f__mutmut_{i}" for i in range(1, 11)} | {
        "pkg.mod.xǁCǁm__mutmut_1", "pkg.mod.xǁCǁm__mutmut_2"}
    assert set(names) <= pool
    assert sample_names(data, ["pkg.mod"], 0.25, 7, tree)[0] == names
    draws = {tuple(sample_names(data, ["pkg.mod"], 0.25, s, tree)[0]) for s in range(20)}
    assert len(draws) > 10  # the seed moves the sample
    assert sorted(sample_names(data, ["pkg.mod"], 1.0, 0, tree)[0]) == sorted(pool)
    assert len(sample_names(data, ["pkg.mod"], 0.01, 0, tree)[0]) == 1  # at least one
    (tree / "pkg" / "mod.py").write_text(SRC.replace("x + 1", "x - 1"))
    names, edited = sample_names(data, ["pkg.mod"], 1.0, 0, tree)
    assert edited == ["pkg.mod.x_f"]
    assert sorted(names) == ["pkg.mod.xǁCǁm__mutmut_1", "pkg.mod.xǁCǁm__mutmut_2"]


def test_ci_narrows_only_the_modules_and_tests_of_the_mutmut_config():
    """The scratch copy's [tool.mutmut]: the sampled modules, the given tests, no git;
    every other option, and the rest of pyproject.toml, as committed."""
    import tomllib

    from mutation.ci import narrowed_config

    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    new = tomllib.loads(narrowed_config(text, ["jaxgrpo.loss", "torchref.loss"],
                                        ["parity_tests/test_loss_truths.py"]))
    old = tomllib.loads(text)
    cfg, was = new["tool"].pop("mutmut"), old["tool"].pop("mutmut")
    assert new == old
    assert cfg.pop("only_mutate") == ["jaxgrpo/loss.py", "torchref/loss.py"]
    assert cfg.pop("pytest_add_cli_args_test_selection") == ["parity_tests/test_loss_truths.py"]
    assert cfg.pop("use_git_change_detection") is False
    for key in ("only_mutate", "pytest_add_cli_args_test_selection"):
        was.pop(key)
    assert cfg == was and "--ignore=parity_tests/test_spec_mutants.py" in cfg[
        "pytest_add_cli_args"]


def test_ci_fails_on_a_survivor_a_wrong_equivalent_and_no_tests():
    from mutation.ci import verdicts

    eq = next(iter(report.EQUIVALENT))
    names = ["a.x_f__mutmut_1", "a.x_f__mutmut_2", "a.x_f__mutmut_3", eq, "a.x_f__mutmut_4"]
    rows, failures = verdicts(names, {"a.x_f__mutmut_1": 1, "a.x_f__mutmut_2": 0,
                                      "a.x_f__mutmut_3": 33, eq: 0, "a.x_f__mutmut_4": -24},
                              {"a.x_f__mutmut_2": 1, eq: 0})
    assert rows == [("a.x_f__mutmut_1", "killed", "not run"),
                    ("a.x_f__mutmut_2", "survived", "killed"),
                    ("a.x_f__mutmut_3", "no tests", "not run"), (eq, "survived", "survived"),
                    ("a.x_f__mutmut_4", "killed", "not run")]  # -24: a timeout
    assert [f.split(":")[0] for f in failures] == ["a.x_f__mutmut_2", "a.x_f__mutmut_3"]
    assert "(the ledger: killed)" in failures[0]
    _, failures = verdicts([eq], {eq: 1}, {})
    assert failures == [f"{eq}: named equivalent in mutation/report.py, but killed: the "
                        "name is wrong, remove it"]
    assert verdicts(names[:1], {}, {})[1] == [
        "a.x_f__mutmut_1: not run (the ledger: not run): `mutmut show a.x_f__mutmut_1`; a "
        "missing test, or an equivalent to name"]


@pytest.mark.parametrize("args, message", [
    (["--share", "0"], "error: --share must lie in (0, 1], got 0.0"),
    (["--max-children", "0"], "error: --max-children must be at least 1, got 0"),
    (["--tests", "parity_tests/nope.py"], "error: --tests: no such test file in "),
    (["jaxgrpo.nope"], "error: modules: jaxgrpo.nope not in the ledger (expected some of "),
])
def test_ci_bad_arguments_are_one_line_naming_the_option(args, message, monkeypatch):
    from mutation import ci

    monkeypatch.setattr(ci.Path, "is_file", lambda self: True)  # as if mutmut were installed
    with pytest.raises(SystemExit) as e:
        ci.main(args)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_ci_defaults_name_test_files_and_recorded_modules():
    """CI's subset names files that exist and modules the committed ledger records, and
    its sample of the committed ledger draws recorded mutants of those modules only."""
    from mutation import ci

    root = Path(__file__).resolve().parent.parent
    assert all((root / t).is_file() for t in ci.TESTS)
    data = ledger.read()
    recorded = {ledger.module_of(k) for k in data["functions"]}
    assert set(ci.MODULES) <= recorded
    names, edited = ci.sample_names(data, list(ci.MODULES), ci.SHARE, ci.SEED, root)
    assert len(names) == len(set(names)) > 0
    assert {ledger.module_of(n) for n in names} <= set(ci.MODULES)
    assert all(n in data["verdicts"] for n in names) or edited  # recorded, or code edited
