"""Run the walkthrough's pages (``docs/NN-*.md``) as doctests.

Every ``>>>`` line of a page is executed, and what it prints is compared with the text
below it, so the pages cannot drift from the package. Each page runs in its own
namespace, which holds ``FIGURES``: the folder the page's cells save their PNGs into.

    python docs/build_figures.py           # run every page; write its figures to docs/figures/
    python docs/build_figures.py 01 03     # only the pages whose names start with 01 or 03
    pytest docs                            # the same pages as tests (figures to a temp folder)

``docs/conftest.py`` collects each page as one pytest item through ``run_page`` below.
"""

from __future__ import annotations

import doctest
import io
import os
import sys
import time
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
FIGURES = DOCS / "figures"
PAGES = sorted(DOCS.glob("[0-9][0-9]-*.md"))
OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def run_page(page: Path, figures: Path) -> tuple[int, int, str]:
    """Execute every example of ``page``; returns ``(failures, examples, report)``."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    if str(ROOT) not in sys.path:  # pages import parity_tests from the checkout
        sys.path.insert(0, str(ROOT))
    figures.mkdir(parents=True, exist_ok=True)
    globs = {"__name__": f"docs.{page.stem}", "FIGURES": figures}
    test = doctest.DocTestParser().get_doctest(
        page.read_text(encoding="utf-8"), globs, page.stem, str(page), 0)
    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS)
    cwd = os.getcwd()
    os.chdir(ROOT)  # pages read docs/experiments/... relative to the checkout's root
    try:
        with np.printoptions(precision=4, suppress=True):
            runner.run(test, out=report.write)
    finally:
        os.chdir(cwd)
    import matplotlib.pyplot as plt

    plt.close("all")
    return runner.failures, runner.tries, report.getvalue()


def main(argv: list[str]) -> int:
    pages = [p for p in PAGES if not argv or any(p.name.startswith(a) for a in argv)]
    failed = 0
    for page in pages:
        t0 = time.perf_counter()
        failures, tries, report = run_page(page, FIGURES)
        print(f"{page.name}: {tries} examples, {failures} failed, "
              f"{time.perf_counter() - t0:.1f} s")
        if failures:
            print(report)
            failed += 1
    print(f"figures in {FIGURES.relative_to(ROOT)}/: "
          + ", ".join(sorted(p.name for p in FIGURES.glob("*.png"))))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
