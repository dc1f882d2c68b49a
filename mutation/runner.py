"""mutmut's pytest runner with one pytest session for all mutants: the fork server's.

mutmut 3.8 (``process_isolation = "forkserver"``) warms a fork server up with
``pytest --collect-only`` and forks a worker per mutant, which calls ``pytest.main``
with the mutant's tests: every mutant pays a whole pytest start (the config, the
plugins, the collection of each test file named, the session's start and end) before
its first test runs. Measured here (README, "Mutation testing") that start cost more
than the tests of a killed mutant.

``WarmSessionRunner`` is mutmut's ``PytestRunner`` with one change: the fork server's
warm-up configures pytest, starts a session and collects the whole selection, and
keeps that session open; a worker (a fork of it) runs the mutant's tests as items of
that session, through pytest's own ``pytest_runtestloop`` (``-x``: it stops at the
first failure). The hooks of ``conftest.py`` run as in a session of its own: the
fixtures (none set up before the fork), the report hooks (``kills.tsv``), the
hypothesis plugin. Which tests run, and in which order, is ``mutation.selection``'s,
as in the per-mutant session. The forced failure and every run outside the fork server
are ``PytestRunner``'s, unchanged. A worker first takes the default SIGTERM and SIGCHLD
handlers back from the fork server (``default_signal_handlers``).

The stats phase and the clean run (one pass over the whole selection each, minutes)
run in ``SHARDS`` processes at once: each forks from the process mutmut runs them in,
takes the next test file (largest first) when it is done with one, and runs it with
``PytestRunner``'s own stats or clean call; what the stats recorded in each (which
tests reach which function, the durations, the callers) is merged into that process's
mutmut state, as one process running all the files would have recorded it. A test
file is the unit, so a module's shared fixtures are set up once, in one process.

The exit codes are pytest's: 1 when a test failed (killed), 0 when all passed
(survived), 5 when ``mutation.selection`` leaves none of the mutant's tests. A test
the session did not collect sends the mutant to ``pytest.main``, which names it. When the warm-up
cannot build the session (a pytest whose internals moved), the fork server says so on
stderr and every worker runs ``pytest.main`` as mutmut does: slower, not different.

``python -m mutation.full`` installs this runner into mutmut's CLI and runs it.
"""

from __future__ import annotations

import fcntl
import gc
import os
import pickle
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from mutmut.runners.harness import PytestRunner
from mutmut.utils.file_utils import change_cwd

from mutation import selection

#: What the fork server says (on stderr) when it falls back to a pytest start a mutant.
NO_WARM_SESSION = "mutation.runner: no warm pytest session"
#: Processes for the stats phase and the clean run (the machine's cores, at most 2).
SHARDS = min(2, os.cpu_count() or 1)


def test_files(selection: Iterable[str], ignored: Iterable[str],
               tests: Iterable[str] = ()) -> dict[str, list[str]]:
    """``{test file: its node ids of tests}``, largest file first, ``[]`` meaning all of
    its tests: the files ``test_*.py`` under the paths of ``selection`` (relative to the
    current directory) less those under ``ignored``; with ``tests`` (node ids), the
    files they name. ``{}`` when ``selection`` holds more than paths (then no sharding)."""
    ignored = [Path(i) for i in ignored]
    out: dict[str, list[str]] = {}
    if tests:
        for t in tests:
            out.setdefault(t.split("::")[0], []).append(t)
    else:
        for arg in selection:
            path = Path(arg)
            if arg.startswith("-") or "::" in arg or not path.exists():
                return {}
            for f in sorted(path.rglob("test_*.py")) if path.is_dir() else [path]:
                if not any(f == i or i in f.parents for i in ignored):
                    out[f.as_posix()] = []
    size = {f: Path(f).stat().st_size if Path(f).is_file() else 0 for f in out}
    return dict(sorted(out.items(), key=lambda kv: (-size[kv[0]], kv[0])))


def ignored_paths(args: list[str]) -> list[str]:
    """The paths of pytest's ``--ignore`` options in ``args``."""
    out = []
    for i, a in enumerate(args):
        if a.startswith("--ignore="):
            out.append(a.removeprefix("--ignore="))
        elif a == "--ignore" and i + 1 < len(args):
            out.append(args[i + 1])
    return out


def run_sharded(files: dict[str, list[str]], shards: int,
                run_file: Callable[[list[str]], int],
                result: Callable[[], Any] = lambda: None) -> tuple[int, list[Any]]:
    """Run ``run_file(args)`` for each file of ``files`` (its node ids, or the file) in
    ``shards`` forked processes, each taking the next file when done with one (and none
    after a failure); returns the first non-zero exit code (pytest's 5, "no tests",
    counts as 0: a file whose tests are all deselected) and each process's ``result()``
    at its end."""
    names = list(files)
    with tempfile.TemporaryDirectory(prefix="mutation-shards-") as tmp:
        counter = Path(tmp) / "next"
        counter.write_text("0")

        def take() -> int:
            with open(counter, "r+") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                i = int(f.read())
                f.seek(0)
                f.truncate()
                f.write(str(len(names) if i < 0 else i + 1))  # -1: a shard failed
                return i

        def fail() -> None:
            with open(counter, "r+") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                f.seek(0)
                f.truncate()
                f.write("-1")

        children = []
        for _ in range(max(1, min(shards, len(names)))):
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:  # never returns: a shard must not go on with its parent's code
                try:
                    os.close(read_fd)
                    code = 0
                    try:
                        while (i := take()) >= 0 and i < len(names):
                            c = run_file(files[names[i]] or [names[i]])
                            if c not in (0, 5):
                                code = c
                                fail()
                                break
                        payload = {"code": code, "result": result()}
                    except BaseException as e:  # noqa: BLE001 - reported to the parent
                        payload = {"code": -1, "result": None, "error": repr(e)}
                    with os.fdopen(write_fd, "wb") as out:
                        pickle.dump(payload, out)
                finally:
                    os._exit(0)
            os.close(write_fd)
            children.append((pid, read_fd))
        code, results = 0, []
        for pid, read_fd in children:  # read before waiting: a payload can exceed the pipe
            with os.fdopen(read_fd, "rb") as f:
                try:
                    payload = pickle.load(f)
                except EOFError:
                    payload = {"code": -1, "result": None, "error": "a shard died"}
            os.waitpid(pid, 0)
            if "error" in payload:
                print(f"mutation.runner: {payload['error']}", file=sys.stderr)
            code = code or payload["code"]
            results.append(payload["result"])
    return code, results


def default_signal_handlers() -> None:
    """Give this process (a mutant's worker) the default SIGTERM and SIGCHLD handlers.

    A worker is a fork of mutmut's fork server and inherits its handlers: on SIGTERM,
    SIGKILL every worker the server had started and exit 0; on SIGCHLD, wake the server.
    So does every process a test forks, e.g. the ranks of a two-process test; and when
    one rank fails, torch.multiprocessing stops the others with SIGTERM. With the
    server's handler such a rank killed the OTHER worker's mutant, which ended by -9
    without a verdict (the one or two such mutants of each full run before 2026-12-06).
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


class WarmSessionRunner(PytestRunner):
    """``PytestRunner`` whose fork server keeps one collected pytest session open."""

    def __init__(self) -> None:
        super().__init__()
        self._session: Any = None
        self._items: dict[str, Any] = {}
        self.durations: dict[str, float] = {}
        self.killers: dict[str, str] = {}

    def warm_up(self) -> None:
        try:
            self._open_session()
        except Exception as e:  # noqa: BLE001 - any failure: mutmut's own way, said once
            print(f"{NO_WARM_SESSION} ({type(e).__name__}: {e}); each mutant starts its "
                  "own", file=sys.__stderr__, flush=True)
            self._session = None
            super().warm_up()

    def _open_session(self) -> None:
        from _pytest.config import _prepareconfig
        from _pytest.main import Session

        args = ["--rootdir=.", "--tb=native", *self._pytest_args_regular_run([]),
                *self._pytest_add_cli_args]
        with change_cwd("mutants"):
            config = _prepareconfig(args)
            session = Session.from_config(config)
            config._do_configure()
            config.hook.pytest_sessionstart(session=session)
            config.hook.pytest_collection(session=session)
            if session.testsfailed:
                raise RuntimeError(f"{session.testsfailed} errors while collecting the tests")
            self.durations = selection.durations()
            self.killers = selection.recorded_killers()
        self._items = {item.nodeid.removeprefix("mutants/"): item for item in session.items}
        self._session = session
        gc.collect()
        gc.freeze()  # the workers' collections skip the half million objects built so far

    def _files(self, tests: Iterable[str]) -> dict[str, list[str]]:
        with change_cwd("mutants"):
            return test_files(self._pytest_add_cli_args_test_selection,
                              ignored_paths(self._pytest_add_cli_args), tests)

    def run_stats(self, *, tests: Iterable[str]) -> int:
        """mutmut's stats, over the test files in ``SHARDS`` processes (module doc)."""
        from mutmut.state import state

        files = self._files(tests)
        if SHARDS < 2 or len(files) < 2:
            return super().run_stats(tests=tests)

        def recorded() -> dict[str, Any]:
            s = state()
            return {"tests": {k: set(v) for k, v in s.tests_by_mangled_function_name.items()},
                    "durations": dict(s.duration_by_test),
                    "callers": {k: set(v) for k, v in s.function_dependencies.items()}}

        code, results = run_sharded(files, SHARDS,
                                    lambda args: PytestRunner.run_stats(self, tests=args),
                                    recorded)
        s = state()
        for r in results:
            if r is None:
                continue
            for k, v in r["tests"].items():
                s.tests_by_mangled_function_name[k] |= v
            s.duration_by_test.update(r["durations"])
            for k, v in r["callers"].items():
                s.function_dependencies[k] |= v
        return code

    def run_forced_fail(self) -> int:
        return PytestRunner.run_tests(self, mutant_name=None, tests=[])

    def run_tests(self, *, mutant_name: str | None, tests: Iterable[str]) -> int:
        if mutant_name is not None:  # in a worker forked for this mutant
            default_signal_handlers()
        session = self._session
        if mutant_name is None and session is None:  # the clean run: sharded
            tests = list(tests)
            files = self._files(tests)
            if SHARDS < 2 or len(files) < 2:
                return super().run_tests(mutant_name=None, tests=tests)
            return run_sharded(files, SHARDS, lambda args: PytestRunner.run_tests(
                self, mutant_name=None, tests=args))[0]
        if session is None or mutant_name is None:
            return super().run_tests(mutant_name=mutant_name, tests=tests)
        tests = list(tests)
        if any(t not in self._items for t in tests):  # pytest.main says which, loudly
            return super().run_tests(mutant_name=mutant_name, tests=tests)
        items = selection.for_mutant([self._items[t] for t in tests], mutant_name,
                                     self.durations, self.killers)
        if not items:
            return 5  # pytest's "no tests collected"
        session.items = items
        session.testscollected = len(items)
        with change_cwd("mutants"):
            try:
                session.config.hook.pytest_runtestloop(session=session)
            except session.Failed:
                pass  # -x: the first failure stops the loop
            except session.Interrupted:
                return 2
        return 1 if session.testsfailed else 0


def install() -> None:
    """Make mutmut's fork server use ``WarmSessionRunner`` (its module-level name)."""
    from mutmut.workers import isolation

    isolation.PytestRunner = WarmSessionRunner


def main(argv: list[str]) -> None:
    """mutmut's command line (``argv``: e.g. ``["run", "--max-children", "2"]``), warm."""
    install()
    from mutmut.__main__ import cli

    cli.main(args=argv, prog_name="mutmut")


if __name__ == "__main__":  # python -m mutation.runner run [NAMES]: ``mutmut run``, warm
    main(sys.argv[1:])
