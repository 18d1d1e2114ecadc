"""tools/kernel_mutants.py: every mutant still applies to the kernel sources as they are (an
edit of the kernels that moves a mutant's text must update the mutant, not silently drop it),
applying one edits only the copy it is given, and a check's exit is read right (a failure is
a catch; a check that could not run, or ran past its time, is not)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import types

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
    km.check_applies(mutant)  # reads the repository only
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


def _run(km, tmp_path, code: str, kind: str = "random", timeout: float = 30.0):
    return km.run_check("check", kind, [sys.executable, "-c", code], tmp_path, timeout)


def test_run_check_reads_the_exit(tmp_path) -> None:
    km = _kernel_mutants()
    assert _run(km, tmp_path, "pass") == ("passed", "")
    status, detail = _run(km, tmp_path, "print('FAIL fp8 seed 7: wrong'); raise SystemExit(1)")
    assert status == "failed" and detail == "check: FAIL fp8 seed 7: wrong"
    # random_cases.py without an SM90 GPU; pytest with nothing selected or a usage error.
    assert _run(km, tmp_path, "raise SystemExit(2)")[0] == "error"
    assert _run(km, tmp_path, "raise SystemExit(5)", kind="pytest")[0] == "error"
    assert _run(km, tmp_path, "raise SystemExit(1)", kind="pytest")[0] == "failed"
    assert _run(km, tmp_path, "import os; os.abort()")[0] == "failed"  # a crash


def test_run_check_kills_the_whole_process_group_on_timeout(tmp_path) -> None:
    km = _kernel_mutants()
    marker = tmp_path / "grandchild.pid"
    # The child starts a grandchild (as precompile starts compile workers) and waits.
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    began = time.monotonic()
    status, detail = _run(km, tmp_path, code, timeout=3.0)
    assert status == "timeout" and "within 3 s" in detail
    assert time.monotonic() - began < 30
    grandchild = int(marker.read_text())
    for _ in range(50):  # killed with its group (reaped by init soon after)
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        with open(f"/proc/{grandchild}/stat") as stat:
            assert stat.read().split()[2] == "Z", "the grandchild outlived the timeout"


@pytest.mark.parametrize("git", ["listed", "no git"])
def test_copy_tree_holds_the_packages_and_tools_but_not_the_docs(
    tmp_path, monkeypatch, git
) -> None:
    km = _kernel_mutants()
    if git == "no git":  # a tarball or export of the tree: `git ls-files` fails
        failed = subprocess.CompletedProcess(args=[], returncode=128, stdout=b"", stderr=b"")
        fake = types.SimpleNamespace(run=lambda *args, **kwargs: failed)
        monkeypatch.setattr(km, "subprocess", fake)  # the module's name only
    km.copy_tree(tmp_path)  # into an existing folder, as the callers' temporary folders are
    for mutant in km.MUTANTS[:3]:
        copied = tmp_path / km.CSRC.relative_to(km.ROOT) / mutant.file
        assert copied.read_text() == (km.CSRC / mutant.file).read_text()
    assert (tmp_path / "tools" / "random_cases.py").is_file()
    assert (tmp_path / "packages" / "attn-scores" / "tests").is_dir()
    assert not (tmp_path / "docs").exists() and not (tmp_path / ".git").exists()


def test_copy_without_git_leaves_out_what_gitignore_names(tmp_path) -> None:
    km = _kernel_mutants()
    root = km.ROOT
    for folder, names, kept in [
        (
            root,
            [".venv", "venv", "dist", "build", "bench-results", ".out", "site", "tools"],
            {"tools"},
        ),
        (root / "packages", ["layouts", "dist"], {"layouts", "dist"}),  # only packages/*/dist
        (root / "packages" / "jit", ["dist", "src", "x.egg-info", "scratch"], {"src"}),
        (root / "tools", ["__pycache__", "bench", "build"], {"bench", "build"}),  # /build only
    ]:
        assert set(names) - km._ignored_in_copy(str(folder), names) == kept, folder


def test_tree_env_puts_the_copy_first_and_drops_the_repository(tmp_path, monkeypatch) -> None:
    km = _kernel_mutants()
    elsewhere = str(tmp_path / "elsewhere")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(km.ROOT / "packages/jit/src"), elsewhere])
    )
    entries = km.tree_env(tmp_path)["PYTHONPATH"].split(os.pathsep)
    assert entries == [*(str(tmp_path / p) for p in km.PACKAGE_PATHS), elsewhere]


def test_shards_split_the_list(monkeypatch, capsys) -> None:
    km = _kernel_mutants()
    listed = []
    for shard in ("1/3", "2/3", "3/3"):
        monkeypatch.setattr(sys, "argv", ["kernel_mutants.py", "--list", "--shard", shard])
        assert km.main() == 0
        listed.append([line.split()[0] for line in capsys.readouterr().out.splitlines()])
    assert sorted(name for names in listed for name in names) == sorted(m.name for m in km.MUTANTS)
    assert all(abs(len(a) - len(b)) <= 1 for a in listed for b in listed)
    for bad in ("0/3", "4/3", "x"):
        monkeypatch.setattr(sys, "argv", ["kernel_mutants.py", "--list", "--shard", bad])
        with pytest.raises(SystemExit):
            km.main()
