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
def test_ci_bad_arguments_are_one_line_naming_the_option(args, message):
    from mutation import ci

    with pytest.raises(SystemExit) as e:  # before it looks for mutmut (not needed here)
        ci.main(args)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_ci_defaults_name_test_files_and_recorded_modules():
    """CI's subset names files that exist and modules the committed ledger records, and
    its sample of the committed ledger draws recorded mutants of those modules only."""
    from mutation import ci

    root = Path(__file__).resolve().parent.parent
    if root.name == "mutants":  # mutmut's copy: every function trampolined, none as recorded
        pytest.skip("the ledger records the checkout's functions, not mutmut's copies")
    assert all((root / t).is_file() for t in ci.TESTS)
    data = ledger.read()
    recorded = {ledger.module_of(k) for k in data["functions"]}
    assert set(ci.MODULES) <= recorded
    names, edited = ci.sample_names(data, list(ci.MODULES), ci.SHARE, ci.SEED, root)
    assert len(names) == len(set(names)) > 0
    assert {ledger.module_of(n) for n in names} <= set(ci.MODULES)
    assert all(n in data["verdicts"] for n in names) or edited  # recorded, or code edited


def test_record_keeps_the_test_that_killed_a_mutant(tree: Path, monkeypatch):
    """conftest.py writes mutants/kills.tsv; --record keeps its test with a kill only, and
    a later run's killer of the same verdict replaces it (not counted as a new verdict)."""
    monkeypatch.chdir(tree)
    made = tree / "mutants" / "pkg"
    made.mkdir(parents=True)
    (made / "mod.py").write_text(SRC)
    (made / "mod.py.meta").write_text(json.dumps({"exit_code_by_key": {
        "pkg.mod.x_f__mutmut_1": 1, "pkg.mod.x_f__mutmut_2": 0, "pkg.mod.xǁCǁm__mutmut_1": 3}}))
    kills = tree / "mutants" / "kills.tsv"
    kills.write_text("pkg.mod.x_f__mutmut_1\tt.py::old\t0.5\n"
                     "pkg.mod.x_f__mutmut_2\tt.py::flaky\t0.1\n"  # not a kill in the meta
                     "pkg.mod.x_f__mutmut_1\tt.py::a\t0.25\n")   # run again: last line wins
    report.main(["--record", "--ledger", "ledger.json"])
    verdicts = ledger.read(tree / "ledger.json")["verdicts"]
    assert verdicts["pkg.mod.x_f__mutmut_1"]["killed_by"] == "t.py::a"
    assert "killed_by" not in verdicts["pkg.mod.x_f__mutmut_2"]
    assert "killed_by" not in verdicts["pkg.mod.xǁCǁm__mutmut_1"]  # killed, no line for it
    assert ledger.killers(ledger.read(tree / "ledger.json")) == {
        "pkg.mod.x_f__mutmut_1": "t.py::a"}
    kills.write_text("pkg.mod.xǁCǁm__mutmut_1\tt.py::b\t1\n")
    assert ledger.record(ledger_results := report.load(tree / "mutants"), tree / "ledger.json",
                         tree, killers=ledger.read_kills(kills)) == 0
    assert ledger_results["pkg.mod"]["pkg.mod.xǁCǁm__mutmut_1"] == 3
    assert ledger.killers(ledger.read(tree / "ledger.json")) == {
        "pkg.mod.x_f__mutmut_1": "t.py::a", "pkg.mod.xǁCǁm__mutmut_1": "t.py::b"}


@pytest.mark.parametrize("line", ["pkg.mod.x_f__mutmut_1\tt.py::a",
                                  "pkg.mod.x_f\tt.py::a\t0.1",
                                  "pkg.mod.x_f__mutmut_1\tt.py::a\tfast"])
def test_a_damaged_kills_file_is_one_line_naming_it(tree: Path, monkeypatch, line):
    monkeypatch.chdir(tree)
    made = tree / "mutants" / "pkg"
    made.mkdir(parents=True)
    (made / "mod.py").write_text(SRC)
    (made / "mod.py.meta").write_text(json.dumps({"exit_code_by_key": {
        "pkg.mod.x_f__mutmut_1": 1}}))
    (tree / "mutants" / "kills.tsv").write_text(f"pkg.mod.x_f__mutmut_2\tt.py::b\t0.1\n{line}\n")
    with pytest.raises(SystemExit) as e:
        report.main(["--record", "--ledger", "ledger.json"])
    assert str(e.value).startswith("error: --record: mutants/kills.tsv, line 2: expected "
                                   "'mutant<TAB>test<TAB>seconds'")
    assert "\n" not in str(e.value) and not (tree / "ledger.json").exists()


def _root_conftest():
    """The checkout's root conftest.py as pytest loaded it (``import conftest`` may find
    another folder's conftest first, e.g. under pytest-xdist)."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parent.parent / "conftest.py"
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) and Path(module.__file__).resolve() == path:
            return module
    spec = importlib.util.spec_from_file_location("_root_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Item:
    def __init__(self, nodeid):
        self.nodeid = nodeid


def test_a_mutant_runs_its_recorded_killer_first_then_cheapest_first(tree: Path, monkeypatch):
    """The root conftest.py, in a mutant's phase inside mutants/: the ledger's killer of
    that mutant first, the others by the stats phase's durations (unknown ones last)."""
    from mutation import selection

    conftest = _root_conftest()

    monkeypatch.chdir(tree)
    (tree / "mutation").mkdir()
    ledger.record(_results(f1=1, f2=1), tree / "mutation" / "ledger.json", tree,
                  killers={"pkg.mod.x_f__mutmut_1": "t.py::slow"})
    (tree / "mutmut-stats.json").write_text(json.dumps({"duration_by_test": {
        "mutants/t.py::fast": 0.1, "t.py::mid": 1.0, "t.py::slow": 9.0}}))
    selection.recorded_killers.cache_clear()
    order = {}
    for mutant in ("pkg.mod.x_f__mutmut_1", "pkg.mod.x_f__mutmut_2"):
        monkeypatch.setenv("MUTANT_UNDER_TEST", mutant)
        items = [_Item(n) for n in ("t.py::new", "t.py::slow", "t.py::mid", "t.py::fast")]
        conftest.pytest_collection_modifyitems(None, items)
        order[mutant] = [i.nodeid for i in items]
    selection.recorded_killers.cache_clear()
    assert order == {"pkg.mod.x_f__mutmut_1": ["t.py::slow", "t.py::fast", "t.py::mid",
                                                "t.py::new"],
                     "pkg.mod.x_f__mutmut_2": ["t.py::fast", "t.py::mid", "t.py::slow",
                                                "t.py::new"]}
    # mutation.full --retarget: the killer takes its place by cost, so a cheaper one can fail
    monkeypatch.setenv(selection.RETARGET, "1")
    monkeypatch.setenv("MUTANT_UNDER_TEST", "pkg.mod.x_f__mutmut_1")
    items = [_Item(n) for n in ("t.py::new", "t.py::slow", "t.py::mid", "t.py::fast")]
    conftest.pytest_collection_modifyitems(None, items)
    selection.recorded_killers.cache_clear()
    assert [i.nodeid for i in items] == ["t.py::fast", "t.py::mid", "t.py::slow", "t.py::new"]


def test_retarget_runs_again_the_kills_whose_killer_is_expensive(tree: Path):
    from mutation import full

    path = tree / "ledger.json"
    ledger.record(_results(f1=1, f2=1, f3=0, f4=1), path, tree,
                  killers={"pkg.mod.x_f__mutmut_1": "t.py::slow", "pkg.mod.x_f__mutmut_2":
                           "t.py::fast", "pkg.mod.x_f__mutmut_4": "t.py::unknown"})
    costs = {"mutants/t.py::slow": 9.0, "t.py::fast": 0.1}
    assert full.expensive_kills(ledger.read(path), costs, 3.0) == [
        "pkg.mod.x_f__mutmut_1", "pkg.mod.x_f__mutmut_4"]
    assert full.expensive_kills(ledger.read(path), costs, 0.0) == [
        "pkg.mod.x_f__mutmut_1", "pkg.mod.x_f__mutmut_2", "pkg.mod.x_f__mutmut_4"]


def test_a_mutant_of_the_loss_skips_the_trainer_and_scaleup_tests():
    """mutation.selection's MUTATION_SKIPS: a loss mutant is judged without the scale-up
    and trainer runs, a scale-up mutant without parity_tests/, another module by all."""
    from mutation import selection

    names = ["scaleup/tests/test_step.py::test_a", "parity_tests/test_cli.py::test_b",
             "parity_tests/test_loss_truths.py::test_c"]
    kept = {m: [i.nodeid for i in selection.for_mutant([_Item(n) for n in names], m, {}, {})]
            for m in ("jaxgrpo.loss.x_f__mutmut_1", "scaleup.step.x_f__mutmut_1",
                      "other.mod.x_f__mutmut_1")}
    assert kept == {"jaxgrpo.loss.x_f__mutmut_1": ["parity_tests/test_loss_truths.py::test_c"],
                    "scaleup.step.x_f__mutmut_1": ["scaleup/tests/test_step.py::test_a"],
                    "other.mod.x_f__mutmut_1": names}


def test_full_names_every_mutant_but_the_named_equivalents_and_the_judged(tree: Path,
                                                                         monkeypatch):
    from mutation import full

    path = tree / "ledger.json"
    ledger.record(_results(f1=1, f2=0, f3=1, f4=1, m1=1), path, tree)
    monkeypatch.setattr(full, "EQUIVALENT", {"pkg.mod.x_f__mutmut_2": ("", "")})
    assert full.names(ledger.read(path), ["pkg.mod"], tree, frozenset({"pkg.mod.x_f__mutmut_4"})
                      ) == ["pkg.mod.x_f__mutmut_1", "pkg.mod.x_f__mutmut_3",
                            "pkg.mod.xǁCǁm__mutmut_1"]
    (tree / "pkg" / "mod.py").write_text(SRC.replace("return 2", "return 3") + "\n\ndef g():\n"
                                         "    return 0\n")
    # m edited and g new: all their mutants, equivalents too (numbers may have moved)
    assert full.names(ledger.read(path), ["pkg.mod"], tree) == [
        "pkg.mod.x_f__mutmut_1", "pkg.mod.x_f__mutmut_3", "pkg.mod.x_f__mutmut_4",
        "pkg.mod.x_g__mutmut_*", "pkg.mod.xǁCǁm__mutmut_*"]
    assert full.modules(Path("pyproject.toml"))[:2] == ["jaxgrpo.loss", "jaxgrpo.advantages"]


class _Report:
    def __init__(self, nodeid, failed):
        self.nodeid, self.failed, self.duration = nodeid, failed, 0.25


def test_a_mutants_first_failing_test_is_written_to_kills_tsv(tree: Path, monkeypatch):
    conftest = _root_conftest()

    monkeypatch.chdir(tree)
    for phase, report_ in [("stats", _Report("mutants/t.py::s", True)),
                           ("pkg.mod.x_f__mutmut_1", _Report("mutants/t.py::ok", False)),
                           ("pkg.mod.x_f__mutmut_1", _Report("mutants/t.py::a", True)),
                           ("pkg.mod.xǁCǁm__mutmut_2", _Report("t.py::b", True))]:
        monkeypatch.setenv("MUTANT_UNDER_TEST", phase)
        conftest.pytest_runtest_logreport(report_)
    assert (tree / "kills.tsv").read_text() == (
        "pkg.mod.x_f__mutmut_1\tt.py::a\t0.250\npkg.mod.xǁCǁm__mutmut_2\tt.py::b\t0.250\n")
    assert ledger.read_kills(tree / "kills.tsv") == {
        "pkg.mod.x_f__mutmut_1": "t.py::a", "pkg.mod.xǁCǁm__mutmut_2": "t.py::b"}
    monkeypatch.delenv("MUTANT_UNDER_TEST")
    conftest.pytest_runtest_logreport(_Report("t.py::c", True))  # outside mutmut: nothing
    assert len(ledger.read_kills(tree / "kills.tsv")) == 2


def test_a_gap_says_why_when_no_test_run_passed(tree: Path, monkeypatch, capsys):
    """The report's gaps: a survivor as its name; no test reaching it, and a run ended by
    a signal before any verdict (e.g. SIGKILL: says nothing about the tests), with why
    and the command that runs it again; a timeout (SIGXCPU) is a kill, not a gap."""
    monkeypatch.chdir(tree)
    made = tree / "mutants" / "pkg"
    made.mkdir(parents=True)
    (made / "mod.py").write_text(SRC)
    (made / "mod.py.meta").write_text(json.dumps({"exit_code_by_key": {
        "pkg.mod.x_f__mutmut_1": 0, "pkg.mod.x_f__mutmut_2": -9, "pkg.mod.x_f__mutmut_3": 33,
        "pkg.mod.x_f__mutmut_4": 1, "pkg.mod.xǁCǁm__mutmut_1": -24}}))
    report.main(["--ledger", "ledger.json"])
    out = capsys.readouterr().out
    assert "| `pkg.mod` | 5 | 2 | 1 | 1 | 0 | 0 | 40.0% |" in out
    assert out.split("surviving mutants not named equivalent (mutmut show NAME):\n")[1] == (
        "  pkg.mod.x_f__mutmut_1\n"
        "  pkg.mod.x_f__mutmut_2  (ended by SIGKILL before a verdict: run it again alone, "
        "`.venv/bin/python -m mutation.runner run --max-children 1 pkg.mod.x_f__mutmut_2`)\n"
        "  pkg.mod.x_f__mutmut_3  (no test reaches it)\n")
    assert report.gap_reason("pkg.mod.x_f__mutmut_5", 7) == "mutmut's exit code 7"
    assert report.gap_reason("pkg.mod.x_f__mutmut_5", -200).startswith(
        "ended by signal 200 before a verdict")
