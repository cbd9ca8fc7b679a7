"""The mutation check (tests/mutants.py): every mutant still applies to the sources, and the tests
chosen for it fail with the mutant applied."""

from __future__ import annotations

import shutil

import pytest

import mutants


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.name)
def test_mutant_replaces_exactly_its_line(tmp_path, mutant):
    target = tmp_path / mutant.path
    target.parent.mkdir(parents=True)
    shutil.copy2(mutants.ROOT / mutant.path, target)
    before = target.read_text().splitlines()
    mutants.apply(mutant, tmp_path)
    after = target.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(before) == len(after) and len(changed) == 1
    old, new = changed[0]
    assert old.strip() == mutant.line and new.strip() == mutant.replacement
    assert old[: len(old) - len(old.lstrip())] == new[: len(new) - len(new.lstrip())]  # indentation kept


@pytest.mark.parametrize("text", ["x = 1\n", "x = 2\n    x = 2\n"])
def test_a_line_not_found_exactly_once_is_an_error(tmp_path, text):
    (tmp_path / "m.py").write_text(text)
    mutant = mutants.Mutant("m", "m.py", "x = 2", "x = 3", ("tests",), "")
    with pytest.raises(mutants.MutantError, match="expected exactly one line 'x = 2' in m.py, found"):
        mutants.apply(mutant, tmp_path)
    assert (tmp_path / "m.py").read_text() == text


@pytest.fixture(scope="module")
def outcomes(request) -> dict:
    """The selected mutants' runs (mutants.run_all): Outcomes, or the MutantError a run raised."""
    chosen = {item.callspec.params["mutant"].name for item in request.session.items
              if getattr(item, "originalname", None) == "test_mutant_is_killed"}
    todo = [m for m in mutants.MUTANTS if m.name in chosen]
    return dict(zip((m.name for m in todo), mutants.run_all(todo)))


@pytest.mark.parametrize("mutant", [pytest.param(m, marks=pytest.mark.slow) if m.name in mutants.SLOW else m
                                     for m in mutants.MUTANTS], ids=lambda m: m.name)
def test_mutant_is_killed(mutant, outcomes):
    outcome = outcomes[mutant.name]
    if isinstance(outcome, Exception):
        raise outcome
    assert outcome.status == "killed", f"{mutant.name} survived ({mutant.bug}):\n{outcome.output}"
