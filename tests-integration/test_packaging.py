"""The published distributions: what each wheel and sdist holds, and what its metadata declares.

Builds every package with hatchling's builder API (no network, no build isolation), then
checks the files a user's install gets and the dependencies it declares, as a downstream
packager would.
"""

from __future__ import annotations

import ast
import email
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

hatchling_wheel = pytest.importorskip("hatchling.builders.wheel")
hatchling_sdist = pytest.importorskip("hatchling.builders.sdist")
requirements = pytest.importorskip("packaging.requirements")
tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {  # dir -> (distribution, import name)
    "layouts": ("flashinfer-layouts", "flashinfer_layouts"),
    "jit": ("flashinfer-jit", "flashinfer_jit"),
    "schedule": ("flashinfer-schedule", "flashinfer_schedule"),
    "attn-scores": ("flashinfer-attn-scores", "flashinfer_attn_scores"),
}
IMPORT_TO_DIST = {imp: dist for dist, imp in PACKAGES.values()}
# Third-party top-level modules -> the distributions that provide them.
THIRD_PARTY = {
    "torch": {"torch"},
    "cuda": {"cuda-core", "cuda-bindings", "cuda-pathfinder"},
    "tqdm": {"tqdm"},
}
# Hatchling releases before 1.27 write License-Expression under Metadata-Version 2.3 (1.25,
# which PyPI and twine reject) or drop the license (1.26.0).
OLDEST_GOOD_HATCHLING = "1.27.0"
BAD_HATCHLING = ("1.25.0", "1.26.0", "1.26.3")


def _pyproject(folder: str) -> dict:
    return tomllib.loads((ROOT / "packages" / folder / "pyproject.toml").read_text())


def _source_files(folder: str) -> set[str]:
    """Files under src/ that belong in the wheel (paths relative to src/)."""
    src = ROOT / "packages" / folder / "src"
    return {
        p.relative_to(src).as_posix()
        for p in src.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    }


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    built = {}
    for folder in PACKAGES:
        builder = hatchling_wheel.WheelBuilder(str(ROOT / "packages" / folder))
        built[folder] = Path(next(builder.build(directory=str(out), versions=["standard"])))
    return built


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(archive.read(name))


@pytest.mark.parametrize("folder", list(PACKAGES))
def test_wheel_holds_every_source_file_and_nothing_else(wheels, folder):
    _, import_name = PACKAGES[folder]
    with zipfile.ZipFile(wheels[folder]) as archive:
        names = {n for n in archive.namelist() if ".dist-info/" not in n}
    expected = _source_files(folder)
    assert names == expected, (
        f"missing: {sorted(expected - names)}; unexpected: {sorted(names - expected)}"
    )
    assert f"{import_name}/py.typed" in names
    assert not any(n.startswith("tests/") or "/tests/" in n for n in names)


def test_every_kernel_source_is_in_a_wheel(wheels):
    """Each .cu / .cuh the runtime may compile or include ships with its package."""
    shipped = set()
    for wheel in wheels.values():
        with zipfile.ZipFile(wheel) as archive:
            shipped |= {n for n in archive.namelist() if n.endswith((".cu", ".cuh"))}
    on_disk = {
        name
        for folder in PACKAGES
        for name in _source_files(folder)
        if name.endswith((".cu", ".cuh"))
    }
    assert on_disk and on_disk <= shipped


@pytest.mark.parametrize("folder", list(PACKAGES))
def test_sdist_holds_sources_readme_tests_and_their_conftest(tmp_path, folder):
    builder = hatchling_sdist.SdistBuilder(str(ROOT / "packages" / folder))
    sdist = Path(next(builder.build(directory=str(tmp_path), versions=["standard"])))
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    # conftest.py: the repository's, so the shipped tests skip `gpu` tests without an SM90 GPU.
    assert {"pyproject.toml", "README.md", "PKG-INFO", "conftest.py"} <= names
    assert {f"src/{n}" for n in _source_files(folder)} <= names
    assert any(n.startswith("tests/") for n in names)


@pytest.mark.parametrize("folder", list(PACKAGES))
def test_metadata_names_version_python_license_and_readme(wheels, folder):
    distribution, import_name = PACKAGES[folder]
    meta = _metadata(wheels[folder])
    assert meta["Name"] == distribution
    init = (ROOT / "packages" / folder / "src" / import_name / "__init__.py").read_text()
    assert f'__version__ = "{meta["Version"]}"' in init
    assert meta["Requires-Python"] == ">=3.10"
    assert meta["License-Expression"] == "Apache-2.0"
    # License-Expression is a Metadata-Version 2.4 field; earlier versions fail upload checks.
    assert tuple(int(x) for x in meta["Metadata-Version"].split(".")) >= (2, 4)
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().startswith(f"# {distribution}")
    assert "Typing :: Typed" in (meta.get_all("Classifier") or [])


@pytest.mark.parametrize("folder", list(PACKAGES))
def test_wheel_and_sdist_carry_the_license_text(wheels, tmp_path, folder):
    """Apache-2.0 asks that the licence text travel with the code: each package folder holds
    the repository's LICENSE (hatchling takes licence files from the project folder only)."""
    text = (ROOT / "LICENSE").read_bytes()
    assert b"Apache License" in text and b"Version 2.0, January 2004" in text
    assert (ROOT / "packages" / folder / "LICENSE").read_bytes() == text
    assert _metadata(wheels[folder]).get_all("License-File") == ["LICENSE"]
    with zipfile.ZipFile(wheels[folder]) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(name) == text
    builder = hatchling_sdist.SdistBuilder(str(ROOT / "packages" / folder))
    sdist = Path(next(builder.build(directory=str(tmp_path), versions=["standard"])))
    with tarfile.open(sdist) as archive:
        (member,) = [m for m in archive.getmembers() if m.name.endswith("/LICENSE")]
        assert archive.extractfile(member).read() == text


def test_the_cuda_wheels_are_required_only_where_they_exist(wheels):
    """cuda-python and the NVIDIA wheels are published for Linux and Windows only; on other
    systems (a macOS laptop running the CPU reference) the packages must install without them."""
    cuda_requirements = [
        requirements.Requirement(line)
        for line in _metadata(wheels["jit"]).get_all("Requires-Dist") or []
        if line.startswith(("cuda-", "nvidia-"))
    ]
    assert len(cuda_requirements) == 6
    for req in cuda_requirements:
        assert req.marker is not None, f"{req} has no platform marker"
        for system, wanted in (("linux", True), ("win32", True), ("darwin", False)):
            assert req.marker.evaluate({"sys_platform": system}) is wanted, (req, system)


@pytest.mark.parametrize("folder", list(PACKAGES))
def test_build_backend_floor_excludes_hatchling_that_writes_bad_metadata(folder):
    (spec,) = [
        requirements.Requirement(r)
        for r in _pyproject(folder)["build-system"]["requires"]
        if r.startswith("hatchling")
    ]
    assert spec.specifier.contains(OLDEST_GOOD_HATCHLING)
    assert not any(spec.specifier.contains(v) for v in BAD_HATCHLING)


def test_sibling_pins_match_the_sibling_versions(wheels):
    versions = {PACKAGES[f][0]: _metadata(w)["Version"] for f, w in wheels.items()}
    pins = 0
    for folder, wheel in wheels.items():
        for line in _metadata(wheel).get_all("Requires-Dist") or []:
            req = requirements.Requirement(line)
            if req.name in versions:
                pins += 1
                assert req.specifier.contains(versions[req.name]), (
                    f"{PACKAGES[folder][0]} requires {line}, but {req.name} is {versions[req.name]}"
                )
    assert pins > 0, "no wheel declares a sibling: the loop above checked nothing"


def _top_level_imports(src: Path) -> set[str]:
    found = set()
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("folder", list(PACKAGES))
def test_every_import_is_a_declared_dependency(wheels, folder):
    """No module of a wheel imports a third-party or sibling module it does not declare."""
    distribution, import_name = PACKAGES[folder]
    declared = {
        requirements.Requirement(line).name
        for line in _metadata(wheels[folder]).get_all("Requires-Dist") or []
    }
    src = ROOT / "packages" / folder / "src"
    for module in sorted(_top_level_imports(src)):
        if module in sys.stdlib_module_names or module in ("__future__", import_name):
            continue
        if module in IMPORT_TO_DIST:
            providers = {IMPORT_TO_DIST[module]}
        else:
            assert module in THIRD_PARTY, f"{distribution} imports {module!r}: add it here"
            providers = THIRD_PARTY[module]
        assert providers & declared, (
            f"{distribution} imports {module!r} but declares none of {sorted(providers)}"
        )
