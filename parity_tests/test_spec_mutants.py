"""The specification-mutant list (``mutation/spec_mutants.py``) still applies to the code.

Each mutant's patches must each match exactly once, so that a refactor cannot silently
turn a mutant into a no-op; running them is ``python -m mutation.spec_mutants`` (see the
README), separate from the suite. One cheap mutant is run here end to end, so the
harness itself is exercised: a shared k1-for-k3 mistake must be caught.
"""

from __future__ import annotations

from pathlib import Path

from mutation.spec_mutants import MUTANTS, _copy_checkout, check_all_apply, run_mutant


def test_every_spec_mutant_still_applies_once():
    assert check_all_apply() == []
    assert len(MUTANTS) >= 35


def test_the_harness_kills_a_shared_mistake(tmp_path: Path):
    _copy_checkout(tmp_path)
    mutant = next(m for m in MUTANTS if m.name == "k1-instead-of-k3")
    result = run_mutant(mutant, tmp_path)
    assert result["status"] == "killed", result
    assert "test_parity.py" not in result["by"]  # an independent truth killed it
