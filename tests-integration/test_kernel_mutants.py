"""tools/kernel_mutants.py: every mutant still applies to the kernel sources as they are (an
edit of the kernels that moves a mutant's text must update the mutant, not silently drop it),
and applying one edits only the tree it is given."""

from __future__ import annotations

import shutil

import pytest


def _kernel_mutants():
    import kernel_mutants

    return kernel_mutants


def test_every_mutant_text_occurs_once_and_changes_it() -> None:
    km = _kernel_mutants()
    for mutant in km.MUTANTS:
        text = (km.CSRC / mutant.file).read_text()
        assert text.count(mutant.old) == 1, mutant.name
        assert mutant.new != mutant.old, mutant.name


def test_names_are_unique_and_configurations_known() -> None:
    km = _kernel_mutants()
    names = [m.name for m in km.MUTANTS]
    assert len(names) == len(set(names))
    for mutant in km.MUTANTS:
        assert mutant.configs and set(mutant.configs) <= set(km.CONFIGS), mutant.name
        assert mutant.variants and set(mutant.variants) <= {"fp8", "fp4"}, mutant.name
        # A configuration of another variant would compile code the mutant's checks never run.
        assert {km.CONFIGS[c][0] for c in mutant.configs} <= set(mutant.variants), mutant.name


def test_apply_edits_only_the_given_tree(tmp_path) -> None:
    km = _kernel_mutants()
    mutant = km.MUTANTS[0]
    copy = tmp_path / km.CSRC.relative_to(km.ROOT)
    shutil.copytree(km.CSRC, copy)
    before = (km.CSRC / mutant.file).read_text()
    original = km.apply(mutant, tmp_path)
    assert original == before
    assert (km.CSRC / mutant.file).read_text() == before  # the repository is untouched
    edited = (copy / mutant.file).read_text()
    assert edited == before.replace(mutant.old, mutant.new) and edited != before


def test_apply_refuses_text_that_is_not_there_once(tmp_path) -> None:
    km = _kernel_mutants()
    mutant = km.MUTANTS[0]
    copy = tmp_path / km.CSRC.relative_to(km.ROOT)
    shutil.copytree(km.CSRC, copy)
    path = copy / mutant.file
    path.write_text(path.read_text() + "\n" + mutant.old + "\n")  # now twice
    with pytest.raises(ValueError, match="occurs 2 times"):
        km.apply(mutant, tmp_path)
