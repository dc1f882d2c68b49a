"""Collect each walkthrough page (``docs/NN-*.md``) as one test that runs its cells.

The cells' figures go to a temporary folder, so the tests leave the tree clean; set
``DOCS_WRITE_FIGURES=1`` (or run ``python docs/build_figures.py``) to write them into
``docs/figures/`` instead.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "docs_build_figures", Path(__file__).with_name("build_figures.py"))
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)


class PageFailed(Exception):
    """A page's cells printed something other than what the page says."""


def pytest_collect_file(file_path: Path, parent):
    if file_path in harness.PAGES:
        return PageFile.from_parent(parent, path=file_path)
    return None


class PageFile(pytest.File):
    def collect(self):
        yield PageItem.from_parent(self, name=self.path.stem)


class PageItem(pytest.Item):
    def runtest(self):
        if os.environ.get("DOCS_WRITE_FIGURES") == "1":
            failures, tries, report = harness.run_page(self.path, harness.FIGURES)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                failures, tries, report = harness.run_page(self.path, Path(tmp))
        if failures:
            raise PageFailed(f"{failures} of {tries} examples failed\n{report}")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, PageFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"walkthrough page {self.path.name}"
