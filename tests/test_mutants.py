"""The mutation check (tests/mutants.py): every mutant still applies to the sources, and the tests
chosen for it fail with the mutant applied."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

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


def start_runs(session) -> None:
    """Start the selected mutants' runs in a background thread, one at a time, when the session has
    more tests than these: the rest of the suite keeps one core busy and the runs take the other
    (tests/conftest.py calls this once collection is done). Alone, the fixture runs two at a time."""
    chosen = {item.callspec.params["mutant"].name for item in session.items
              if getattr(item, "originalname", None) == "test_mutant_is_killed"}
    if chosen and len(chosen) < len(session.items):
        todo = [m for m in mutants.MUTANTS if m.name in chosen]
        pool = ThreadPoolExecutor(max_workers=1)
        session.config.stash[RUNS] = pool.submit(lambda: dict(zip((m.name for m in todo), mutants.run_all(todo, workers=1))))
        pool.shutdown(wait=False)


RUNS = pytest.StashKey()


@pytest.fixture(scope="module")
def outcomes(request) -> dict:
    """The selected mutants' runs (mutants.run_all): Outcomes, or the MutantError a run raised."""
    started = request.config.stash.get(RUNS, None)
    if started is not None:
        return started.result()
    chosen = {item.callspec.params["mutant"].name for item in request.session.items
              if getattr(item, "originalname", None) == "test_mutant_is_killed"}
    todo = [m for m in mutants.MUTANTS if m.name in chosen]
    return dict(zip((m.name for m in todo), mutants.run_all(todo)))


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed(mutant, outcomes):
    outcome = outcomes[mutant.name]
    if isinstance(outcome, Exception):
        raise outcome
    assert outcome.status == "killed", f"{mutant.name} survived ({mutant.bug}):\n{outcome.output}"
