"""mutation.runner (one open pytest session for all mutants) and the stats phase's
durations (conftest.py): on a tiny project, in a subprocess, as mutmut's fork server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

TESTS = '''
import os

CALLS = []

def test_passes():
    CALLS.append("passes")

def test_fails_for_mutant_1():
    CALLS.append("fails_for_mutant_1")
    assert os.environ["MUTANT_UNDER_TEST"] != "pkg.mod.x_f__mutmut_1"

def test_records_the_order():
    with open(os.environ["ORDER_FILE"], "a") as f:
        f.write(",".join(CALLS) + "\\n")
'''

# The fork server: warm up once, then one fork per mutant (mutmut's _forkserver_main).
SERVER = '''
import json, os, sys
sys.path.insert(0, {root!r})
from mutation.runner import WarmSessionRunner
from mutmut.mutation.trampoline import set_mutant_under_test

runner = WarmSessionRunner()
stdout, sys.stdout = sys.stdout, open(os.devnull, "w")  # as mutmut's fork server
runner.warm_up()
sys.stdout = stdout
out = {{"warm": runner._session is not None, "codes": {{}}}}
for mutant, tests in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        set_mutant_under_test(mutant)
        os._exit(runner.run_tests(mutant_name=mutant, tests=tests))
    out["codes"][mutant] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(out))
'''


def test_each_mutant_runs_in_the_open_session_with_its_own_verdict(tmp_path: Path):
    """Killed (1), survived (0) and no test left by mutation.selection (5), as
    pytest.main would say; each fork starts from the warm session (the tests' module state is the
    collection's, not the previous mutant's); the session is the warm one, not the
    fallback (a pytest whose internals moved would turn this test red, not only slow)."""
    pytest.importorskip("mutmut")
    (tmp_path / "pyproject.toml").write_text('[tool.mutmut]\nsource_paths = ["pkg"]\n')
    (tmp_path / "mutants" / "parity_tests").mkdir(parents=True)
    (tmp_path / "mutants" / "parity_tests" / "test_t.py").write_text(TESTS)
    order = tmp_path / "order.txt"
    t = "parity_tests/test_t.py::"
    jobs = [("pkg.mod.x_f__mutmut_1", [t + "test_passes", t + "test_fails_for_mutant_1"]),
            ("pkg.mod.x_f__mutmut_2", [t + "test_fails_for_mutant_1", t + "test_passes",
                                       t + "test_records_the_order"]),
            # mutation.selection: a scale-up mutant is not judged by parity_tests/
            ("scaleup.tasks.x_f__mutmut_1", [t + "test_fails_for_mutant_1"])]
    env = {**os.environ, "ORDER_FILE": str(order), "PYTHONPATH": ""}
    env.pop("MUTANT_UNDER_TEST", None)
    run = subprocess.run([sys.executable, "-c", SERVER.format(root=str(ROOT)), json.dumps(jobs)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out == {"warm": True, "codes": {"pkg.mod.x_f__mutmut_1": 1,
                                           "pkg.mod.x_f__mutmut_2": 0,
                                           "scaleup.tasks.x_f__mutmut_1": 5}}
    # mutant 2 ran its three tests, and its fork did not see mutant 1's calls
    assert order.read_text() == "fails_for_mutant_1,passes\n"


class _Def:
    def __init__(self, scope):
        self.scope, self.baseid = scope, "test_x.py"


class _Item:
    def __init__(self, nodeid, fixtures):
        self.nodeid, self.fixturenames = nodeid, list(fixtures)
        self._fixtureinfo = types.SimpleNamespace(
            name2fixturedefs={n: [_Def(s)] for n, s in fixtures.items()})


def test_stats_durations_count_setups_and_the_costs_the_shared_fixtures(monkeypatch, tmp_path):
    """In mutmut's stats phase each test's duration (mutmut's timeouts) also counts its
    setup and teardown (mutmut adds the call); its cost alone (the order of a mutant's
    tests, mutation-costs.json) adds the setup of each module fixture it uses, paid by
    the first test that built it. Outside the stats phase nothing is recorded."""
    pytest.importorskip("mutmut")
    import mutmut.state  # noqa: F401 - the module (the package's `state` is its function)

    from mutation import selection
    from parity_tests.test_mutation_ledger import _root_conftest

    conftest = _root_conftest()
    monkeypatch.setattr(conftest, "_FIXTURE_SETUP", {})
    monkeypatch.setattr(conftest, "_COST_ALONE", {})
    durations: dict[str, float] = {}
    monkeypatch.setattr(sys.modules["mutmut.state"], "state",
                        lambda: types.SimpleNamespace(duration_by_test=durations))
    ranks = _Item("test_x.py::test_first", {"ranks": "module", "tmp_path": "function"})
    later = _Item("test_x.py::test_later", {"ranks": "module"})
    alone = _Item("test_x.py::test_alone", {"tmp_path": "function"})
    call = types.SimpleNamespace
    monkeypatch.setenv("MUTANT_UNDER_TEST", "stats")
    monkeypatch.chdir(tmp_path)
    for item, setup, teardown in ((ranks, 12.0, 0.5), (later, 0.01, 0.0), (alone, 0.02, 0.0)):
        conftest.pytest_runtest_makereport(item, call(when="setup", duration=setup))
        conftest.pytest_runtest_makereport(item, call(when="call", duration=1.0))
        conftest.pytest_runtest_makereport(item, call(when="teardown", duration=teardown))
    assert durations == pytest.approx({"test_x.py::test_first": 12.5,
                                       "test_x.py::test_later": 0.01,
                                       "test_x.py::test_alone": 0.02})
    conftest.pytest_sessionfinish(None)
    (tmp_path / "mutmut-stats.json").write_text(json.dumps({"duration_by_test": durations}))
    assert selection.durations() == pytest.approx({"test_x.py::test_first": 13.5,
                                                   "test_x.py::test_later": 13.01,
                                                   "test_x.py::test_alone": 1.02})
    monkeypatch.setenv("MUTANT_UNDER_TEST", "pkg.mod.x_f__mutmut_1")
    conftest.pytest_runtest_makereport(alone, call(when="setup", duration=5.0))
    assert durations["test_x.py::test_alone"] == pytest.approx(0.02)


def test_the_ranks_fork_only_in_a_mutants_run(monkeypatch):
    """The two-process tests spawn their ranks (as torchrun's are fresh), except in a
    mutant's run under mutmut, where they fork from the test process (no import of torch
    and transformers again: a two-process test 20-30 s -> a few s there)."""
    start_method = pytest.importorskip("scaleup.tests.dist_helpers").start_method

    monkeypatch.delenv("MUTANT_UNDER_TEST", raising=False)
    seen = [start_method()]
    for phase in ("stats", "fail", "scaleup.step.x_f__mutmut_1"):
        monkeypatch.setenv("MUTANT_UNDER_TEST", phase)
        seen.append(start_method())
    assert seen == ["spawn", "spawn", "spawn", "fork"]


def test_the_test_files_largest_first_less_the_ignored_ones(tmp_path, monkeypatch):
    pytest.importorskip("mutmut")
    from mutation.runner import ignored_paths, test_files

    for name, size in (("a/test_small.py", 10), ("a/test_big.py", 300), ("a/deep/test_mid.py", 50),
                       ("a/helpers.py", 999), ("a/test_ignored.py", 999),
                       ("a/skipped/test_x.py", 999), ("b/test_other.py", 20)):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("#" * size)
    monkeypatch.chdir(tmp_path)
    ignored = ignored_paths(["-p", "no:x", "--ignore=a/test_ignored.py", "--ignore", "a/skipped",
                             "-W", "ignore::DeprecationWarning"])
    assert ignored == ["a/test_ignored.py", "a/skipped"]
    assert test_files(["a", "b"], ignored) == {
        "a/test_big.py": [], "a/deep/test_mid.py": [], "b/test_other.py": [],
        "a/test_small.py": []}
    assert test_files(["a"], [], ["a/test_small.py::t1", "a/test_big.py::t2",
                                  "a/test_small.py::t3[x]"]) == {
        "a/test_big.py": ["a/test_big.py::t2"],
        "a/test_small.py": ["a/test_small.py::t1", "a/test_small.py::t3[x]"]}
    for selection in (["a", "-k", "x"], ["a/test_big.py::t2"], ["missing"]):
        assert test_files(selection, []) == {}  # not only paths: run as one pytest


def test_sharded_runs_take_each_file_once_and_stop_at_a_failure(tmp_path):
    """Two processes share the files (each takes the next when done with one); each
    returns what it recorded; a failure's exit code is returned and no file is started
    after it; "no tests" (pytest's 5) is not a failure."""
    import time

    pytest.importorskip("mutmut")
    from mutation.runner import run_sharded

    log = tmp_path / "log"
    ran: list[str] = []

    def run_file(args):
        ran.extend(args)
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {args[0]}\n")
        time.sleep(0.05)
        return {"f5": 5, "bad": 1}.get(args[0].split("::")[0], 0)

    files = {f"f{i}": [] for i in range(8)}
    files["f3"] = ["f3::a", "f3::b"]
    code, results = run_sharded(files, 2, run_file, lambda: list(ran))
    assert code == 0
    lines = [line.split() for line in log.read_text().splitlines()]
    assert sorted(name for _, name in lines) == sorted(["f0", "f1", "f2", "f3::a", "f4", "f5",
                                                        "f6", "f7"])
    assert len({pid for pid, _ in lines}) == 2 and os.getpid() not in {int(p) for p, _ in lines}
    assert sorted(sum(results, [])) == sorted(["f0", "f1", "f2", "f3::a", "f3::b", "f4", "f5",
                                               "f6", "f7"])
    assert ran == []  # the parent ran nothing itself
    log.unlink()
    code, _ = run_sharded({"bad": [], **{f"g{i}": [] for i in range(20)}}, 2, run_file)
    assert code == 1
    assert len(log.read_text().splitlines()) < 21  # the failure stopped the queue


STATS = '''
import json, os, sys
sys.path.insert(0, {root!r})
from mutmut.runners.harness import PytestRunner
from mutmut.state import state
from mutation.runner import WarmSessionRunner

def fake_stats(self, *, tests):  # what mutmut's stats record for one test file
    f = tests[0]
    state().tests_by_mangled_function_name["pkg.mod.x_f"].add(f + "::t")
    state().tests_by_mangled_function_name["pkg.mod.x_" + f[-4]].add(f + "::t")
    state().duration_by_test[f + "::t"] = len(f)
    state().function_dependencies["pkg.mod.x_f"].add("pkg.mod.x_" + f[-4])
    return 0

PytestRunner.run_stats = fake_stats
code = WarmSessionRunner().run_stats(tests=[])
s = state()
print(json.dumps({{"code": code, "pid": os.getpid(),
                  "tests": {{k: sorted(v) for k, v in s.tests_by_mangled_function_name.items()}},
                  "durations": s.duration_by_test,
                  "callers": {{k: sorted(v) for k, v in s.function_dependencies.items()}}}}))
'''


def test_the_sharded_stats_merge_into_mutmuts_state_as_one_process(tmp_path: Path):
    pytest.importorskip("mutmut")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.mutmut]\nsource_paths = ["pkg"]\npytest_add_cli_args_test_selection = ["t"]\n')
    for name in ("test_a.py", "test_b.py", "test_c.py"):
        (tmp_path / "mutants" / "t").mkdir(parents=True, exist_ok=True)
        (tmp_path / "mutants" / "t" / name).write_text("")
    env = {**os.environ, "PYTHONPATH": ""}
    run = subprocess.run([sys.executable, "-c", STATS.format(root=str(ROOT))], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    files = ["t/test_a.py", "t/test_b.py", "t/test_c.py"]
    assert out["code"] == 0
    assert out["tests"] == {"pkg.mod.x_f": [f + "::t" for f in files],
                            **{f"pkg.mod.x_{c}": [f"t/test_{c}.py::t"] for c in "abc"}}
    assert out["durations"] == {f + "::t": 11 for f in files}
    assert out["callers"] == {"pkg.mod.x_f": ["pkg.mod.x_a", "pkg.mod.x_b", "pkg.mod.x_c"]}


SIGTERM_TESTS = '''
import os, signal, time

def test_a_forked_rank_stopped_with_sigterm_dies_of_it():
    """As torch.multiprocessing stops the other ranks when one fails."""
    assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL  # not the server's wake-up
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(3)
    time.sleep(0.2)
    os.kill(pid, signal.SIGTERM)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == -signal.SIGTERM
'''

# mutmut's fork server with its signal handlers (_forkserver_main): on SIGTERM, SIGKILL
# every worker it runs; one worker (the other mutant) is running when this one starts.
SIGTERM_SERVER = '''
import json, os, signal, sys, time
sys.path.insert(0, {root!r})
from mutation.runner import WarmSessionRunner
from mutmut.mutation.trampoline import set_mutant_under_test

runner = WarmSessionRunner()
stdout, sys.stdout = sys.stdout, open(os.devnull, "w")
runner.warm_up()
sys.stdout = stdout
other = os.fork()
if other == 0:
    time.sleep(60)
    os._exit(0)
running = {{other: "pkg.mod.x_g__mutmut_1"}}

def terminate(signum, frame):
    for pid in list(running):
        os.kill(pid, signal.SIGKILL)
    os._exit(0)

signal.signal(signal.SIGTERM, terminate)
signal.signal(signal.SIGCHLD, lambda *a: None)
mutant, tests = json.loads(sys.argv[1])
pid = os.fork()
if pid == 0:
    set_mutant_under_test(mutant)
    os._exit(runner.run_tests(mutant_name=mutant, tests=tests))
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
other_alive = os.waitpid(other, os.WNOHANG) == (0, 0)
if other_alive:
    os.kill(other, signal.SIGKILL)
print(json.dumps({{"warm": runner._session is not None, "code": code,
                  "other_alive": other_alive}}))
'''


def test_a_mutants_forked_processes_do_not_inherit_the_fork_servers_sigterm(tmp_path):
    """A worker and the processes its tests fork get the default SIGTERM (and SIGCHLD)
    handler, not the fork server's (which SIGKILLs every worker): a two-process test
    failing in one rank (torch SIGTERMs the other) ended the other worker's mutant by -9,
    without a verdict.
    Here the test passes (its forked child dies of the SIGTERM) and the other worker
    lives; with the server's handler inherited the test fails and the other is killed."""
    pytest.importorskip("mutmut")
    (tmp_path / "pyproject.toml").write_text('[tool.mutmut]\nsource_paths = ["pkg"]\n')
    (tmp_path / "mutants" / "parity_tests").mkdir(parents=True)
    (tmp_path / "mutants" / "parity_tests" / "test_t.py").write_text(SIGTERM_TESTS)
    job = ("pkg.mod.x_f__mutmut_1",
           ["parity_tests/test_t.py::test_a_forked_rank_stopped_with_sigterm_dies_of_it"])
    env = {**os.environ, "PYTHONPATH": ""}
    env.pop("MUTANT_UNDER_TEST", None)
    run = subprocess.run([sys.executable, "-c", SIGTERM_SERVER.format(root=str(ROOT)),
                          json.dumps(job)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {
        "warm": True, "code": 0, "other_alive": True}
