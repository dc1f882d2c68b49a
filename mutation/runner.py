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
as in the per-mutant session. Everything else (the stats, the clean run, the forced
failure, every run outside the fork server) is ``PytestRunner``'s, unchanged.

The exit codes are pytest's: 1 when a test failed (killed), 0 when all passed
(survived), 5 when ``mutation.selection`` leaves none of the mutant's tests. A test
the session did not collect sends the mutant to ``pytest.main``, which names it. When the warm-up
cannot build the session (a pytest whose internals moved), the fork server says so on
stderr and every worker runs ``pytest.main`` as mutmut does: slower, not different.

``python -m mutation.full`` installs this runner into mutmut's CLI and runs it.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterable
from typing import Any

from mutmut.runners.harness import PytestRunner
from mutmut.utils.file_utils import change_cwd

from mutation import selection

#: What the fork server says (on stderr) when it falls back to a pytest start a mutant.
NO_WARM_SESSION = "mutation.runner: no warm pytest session"


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

    def run_tests(self, *, mutant_name: str | None, tests: Iterable[str]) -> int:
        session = self._session
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
