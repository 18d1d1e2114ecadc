"""KernelSpec normalisation, hashing and pickling."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from flashinfer_jit import KernelSpec


def test_dict_and_pairs_normalise_to_the_same_sorted_spec():
    a = KernelSpec.make("k", "/x/k.cu", {"B": 2, "A": "x"})
    b = KernelSpec("k", Path("/x/k.cu"), (("A", "x"), ("B", 2)))
    assert a == b
    assert hash(a) == hash(b)
    assert a.defines == (("A", "x"), ("B", 2))
    assert a.label == "k[A=x, B=2]"


def test_label_does_not_take_part_in_equality():
    a = KernelSpec.make("k", "/x/k.cu", {"A": 1}, label="first")
    b = KernelSpec.make("k", "/x/k.cu", {"A": 1}, label="second")
    assert a == b and hash(a) == hash(b)


def test_different_defines_differ():
    assert KernelSpec.make("k", "/x/k.cu", {"A": 1}) != KernelSpec.make("k", "/x/k.cu", {"A": 2})


def test_pickle_round_trip_keeps_equality_and_hash():
    spec = KernelSpec.make("k", "/x/k.cu", {"A": 1}, include_dirs=["/inc"], options=["-lineinfo"])
    again = pickle.loads(pickle.dumps(spec))
    assert again == spec and hash(again) == hash(spec)
    assert {spec: 1}[again] == 1


def test_with_defines_adds_and_replaces():
    spec = KernelSpec.make("k", "/x/k.cu", {"A": 1, "B": 2})
    assert spec.with_defines(B=5, C="z").defines == (("A", 1), ("B", 5), ("C", "z"))


@pytest.mark.parametrize(
    ("defines", "error", "fragment"),
    [
        ({"A": 1.5}, TypeError, "expected str or int"),
        ({"A": True}, TypeError, "expected str or int"),
        ({"1A": 1}, ValueError, "C identifier"),
        ([("A", 1), ("A", 2)], ValueError, "given twice"),
        ([("A",)], TypeError, "(name, value) pairs"),
        # NVRTC reads C strings: "4" would be compiled and the rest silently dropped.
        ({"A": "4\x00 * 1000"}, ValueError, "contains a NUL byte"),
    ],
)
def test_bad_defines_are_rejected(defines, error, fragment):
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        KernelSpec.make("k", "/x/k.cu", defines)


def test_a_define_repeated_with_the_same_value_is_accepted_once():
    """Only a macro given twice with different values is an error (KernelSpec.make)."""
    spec = KernelSpec.make("k", "/x/k.cu", [("A", 1), ("B", "x"), ("A", 1)])
    assert spec.defines == (("A", 1), ("B", "x"))
    assert spec == KernelSpec.make("k", "/x/k.cu", {"A": 1, "B": "x"})


def test_bare_string_options_are_rejected():
    with pytest.raises(TypeError, match="options"):
        KernelSpec("k", Path("/x/k.cu"), options="-lineinfo")  # type: ignore[arg-type]


def test_name_must_be_a_name_expression_when_templates_are_used():
    with pytest.raises(ValueError, match="name_expressions"):
        KernelSpec.make("f<1>", "/x/k.cu", name_expressions=["f<2>"])


@pytest.mark.parametrize(
    ("field", "value"),
    [("include_dirs", "/tmp"), ("options", "-w"), ("name_expressions", "abc")],
)
def test_make_rejects_a_bare_str_like_the_constructor(field, value):
    """A bare str is a sequence of characters: `make` must not split it up."""
    with pytest.raises(TypeError) as from_constructor:
        KernelSpec("abc", Path("/x/k.cu"), **{field: value})
    with pytest.raises(TypeError, match=f"KernelSpec.{field}: expected a sequence") as from_make:
        KernelSpec.make("abc", "/x/k.cu", **{field: value})
    assert str(from_make.value) == str(from_constructor.value)


def test_a_macro_name_with_a_trailing_newline_is_not_an_identifier():
    with pytest.raises(ValueError, match=r"C identifier, got 'OFFSET\\n'"):
        KernelSpec.make("k", "/x/k.cu", {"OFFSET\n": 1})


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"source": ""}, "KernelSpec.source: expected a path, got an empty str"),
        ({"source": "/x/a\x00b.cu"}, "KernelSpec.source: path contains a NUL byte"),
        ({"include_dirs": ["/inc\x00"]}, "KernelSpec.include_dirs: path contains a NUL byte"),
    ],
)
def test_paths_that_cannot_name_a_file_are_rejected(fields, fragment):
    arguments = {"name": "k", "source": "/x/k.cu", **fields}
    with pytest.raises(ValueError, match=fragment):
        KernelSpec.make(**arguments)
    with pytest.raises(ValueError, match=fragment):
        KernelSpec(**arguments)


def test_make_names_the_source_when_it_is_not_a_path():
    with pytest.raises(TypeError, match=r"KernelSpec\.source: expected a pathlib\.Path or str"):
        KernelSpec.make("k", None)  # type: ignore[arg-type]


def test_dot_dot_after_a_symlink_names_the_file_the_system_opens(tmp_path):
    # lnk -> real/sub: lnk/../kernel.cu is real/kernel.cu, not tmp_path/kernel.cu.
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "real" / "kernel.cu").write_text("// the one opened\n")
    (tmp_path / "kernel.cu").write_text("// a decoy\n")
    (tmp_path / "lnk").symlink_to(tmp_path / "real" / "sub")
    spec = KernelSpec.make("k", tmp_path / "lnk" / ".." / "kernel.cu")
    assert spec.source.is_absolute()
    assert spec.source.read_text() == "// the one opened\n"


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"options": ["--std=c++17\x00"]}, ValueError, r"KernelSpec.options: .* NUL byte"),
        ({"name_expressions": ["k\x00<1>"]}, ValueError, r"KernelSpec.name_expressions: .* NUL"),
        ({"options": None}, TypeError, r"^KernelSpec.options: expected a sequence, got NoneType"),
        ({"include_dirs": 3}, TypeError, r"^KernelSpec.include_dirs: expected a sequence, got int"),
        ({"label": 5}, TypeError, r"^KernelSpec.label: expected a str, got int"),
    ],
)
def test_make_names_the_argument_it_cannot_use(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        KernelSpec.make("k", "/x/k.cu", **kwargs)


@pytest.mark.parametrize(("name", "error"), [(None, TypeError), (3, TypeError), ("", ValueError)])
def test_a_name_that_is_no_str_or_empty_is_refused(name, error):
    with pytest.raises(error, match=r"^KernelSpec.name: expected a non-empty str"):
        KernelSpec.make(name, "/x/k.cu")


@pytest.mark.parametrize("defines", [5, "AB", b"AB", 1.5])
def test_defines_of_another_kind_are_named(defines):
    with pytest.raises(TypeError, match=r"defines: expected a dict or \(name, value\) pairs, got"):
        KernelSpec.make("k", "/tmp/k.cu", defines)


@pytest.mark.parametrize(
    ("defines", "error", "message"),
    [
        ({"B": True}, TypeError, r"defines\['B'\]: expected str or int, got bool"),
        ({"1B": 2}, ValueError, r"macro name must be a C identifier, got '1B'"),
        ({"B": "x\x00"}, ValueError, r"defines\['B'\]: value contains a NUL byte"),
    ],
)
def test_with_defines_checks_as_make_does(defines, error, message):
    spec = KernelSpec.make("k", "/tmp/k.cu", {"A": 1})
    with pytest.raises(error, match=message):
        spec.with_defines(**defines)


def test_defines_iterable_through_getitem_only_are_taken():
    class Pairs:  # the old sequence protocol: iterable without __iter__
        def __getitem__(self, index):
            if index >= 1:
                raise IndexError(index)
            return ("A", 1)

    assert KernelSpec.make("k", "/tmp/k.cu", Pairs()).defines == (("A", 1),)
