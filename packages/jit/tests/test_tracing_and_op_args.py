"""`flashinfer_jit.tracing` and `flashinfer_jit.op_args`, the helpers the kernel packages'
public functions share (CPU only)."""

import re

import numpy as np
import pytest
import torch
from flashinfer_jit import op_args
from flashinfer_jit.op_args import check_int, describe, int_hint, shown, type_name
from flashinfer_jit.tracing import plain_eager
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx


def _branch(x: torch.Tensor) -> torch.Tensor:
    return x + 1 if plain_eager() else x - 1


def test_plain_eager_outside_every_tracer():
    assert plain_eager()
    assert torch.equal(_branch(torch.zeros(2)), torch.ones(2))


def test_plain_eager_false_under_torch_compile():
    compiled = torch.compile(_branch, fullgraph=True, backend="eager")
    assert torch.equal(compiled(torch.zeros(2)), -torch.ones(2))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.trace from 2.11 on
def test_plain_eager_false_under_jit_trace():
    traced = torch.jit.trace(_branch, torch.zeros(2), check_trace=False)
    assert torch.equal(traced(torch.zeros(2)), -torch.ones(2))


def test_plain_eager_false_under_dispatch_modes():
    with FakeTensorMode():
        assert not plain_eager()
    graph = make_fx(_branch)(torch.zeros(2))
    assert torch.equal(graph(torch.zeros(2)), -torch.ones(2))
    assert plain_eager()  # the modes are popped again


def test_plain_eager_false_under_torch_func_transforms():
    """Their tensors are wrappers without storage (no data pointer to launch on)."""
    seen = []

    def record(x: torch.Tensor) -> torch.Tensor:
        seen.append(plain_eager())
        return (x * x).sum()

    torch.func.grad(record)(torch.ones(2))
    torch.func.vmap(record)(torch.ones(3, 2))
    torch.func.functionalize(record)(torch.ones(2))
    assert seen == [False, False, False]


def test_check_int_takes_python_and_numpy_integers():
    assert check_int("n", 7) == 7
    value = check_int("n", np.int64(7))
    assert value == 7 and type(value) is int


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (True, "bool (True)"),
        (np.bool_(True), "numpy.bool"),
        (2.0, "float (2.0)"),
        ("3", "str ('3')"),
        (torch.tensor(3), "torch.Tensor of dtype torch.int64, shape [] on cpu"),
    ],
)
def test_check_int_refuses_other_values_by_name(value, named):
    with pytest.raises(TypeError, match=r"^max_seq_len must be an int, got ") as info:
        check_int("max_seq_len", value)
    assert named in str(info.value)


def test_a_tensor_given_for_an_int_gets_a_hint():
    with pytest.raises(TypeError, match=r"pass a Python int such as int\(t.max\(\)\)"):
        check_int("max_seq_len", torch.tensor(3))
    assert int_hint(3) == ""


def test_describe_never_prints_tensor_data():
    t = torch.full((2, 3), 123456.0)
    text = describe(t)
    assert text == "torch.Tensor of dtype torch.float32, shape [2, 3] on cpu"
    assert "123456" not in text


def test_type_name_qualifies_non_builtins():
    assert type_name(3) == "int"
    assert type_name(np.int32(3)) == "numpy.int32"


def test_shown_is_the_value_itself_in_eager():
    assert shown(5) == 5 and shown(2.5) == 2.5 and shown(True) is True


def test_sizes_and_strides_print_like_torch():
    t = torch.zeros(2, 8, 128)
    assert op_args.sizes(t.shape) == str(list(t.shape)) == "[2, 8, 128]"
    assert op_args.strides(t.stride()) == str(t.stride()) == "(1024, 128, 1)"
    assert op_args.strides(torch.zeros(5).stride()) == "(1,)"
    assert op_args.sizes(torch.zeros(()).shape) == "[]"


def test_sizes_print_numbers_under_a_dynamic_trace():
    """Formatted as they are, symbolic sizes print as symbols ("[s48, s91]", "s85**2")."""

    def refuse(t):
        raise ValueError(f"shape {op_args.sizes(t.shape)}, strides {op_args.strides(t.stride())}")

    t = torch.zeros(7, 5)[:, :3]
    expected = "shape [7, 3], strides (5, 1)"
    with pytest.raises(ValueError, match=re.escape(expected)):
        refuse(t)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=re.escape(expected)):
        torch.compile(refuse, fullgraph=True, dynamic=True)(t)
    assert describe(t) == "torch.Tensor of dtype torch.float32, shape [7, 3] on cpu"


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_size_read_from_data_prints_as_a_question_mark(dynamic):
    """nonzero()'s row count has no value while dynamo traces: formatting it as a number
    would lose the whole message (dynamo cannot trace the string built from it)."""

    def refuse(x):
        rows = x.nonzero()
        raise ValueError(
            f"shape {op_args.sizes(rows.shape)}, strides {op_args.strides(rows.stride())}; {describe(rows)}"
        )

    x = torch.tensor([0, 3, 0, 4, 5])
    with pytest.raises(ValueError, match=re.escape("shape [3, 1], strides (1, 3);")):
        refuse(x)
    expected = (
        "shape [?, 1], strides (1, ?); torch.Tensor of dtype torch.int64, shape [?, 1] on cpu"
    )
    torch._dynamo.reset()
    with (
        torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True),
        pytest.raises(torch._dynamo.exc.Unsupported, match=re.escape(expected)),
    ):
        torch.compile(refuse, fullgraph=True, dynamic=dynamic)(x)


def test_describe_names_a_traced_tensors_shape():
    def refuse(t):
        raise TypeError(f"got {describe(t)}")

    t = torch.zeros(3, 4, dtype=torch.int32)
    torch._dynamo.reset()
    with pytest.raises(
        torch._dynamo.exc.Unsupported,
        match=re.escape("got torch.Tensor of dtype torch.int32, shape [3, 4] on cpu"),
    ):
        torch.compile(refuse, fullgraph=True, dynamic=True)(t)


def test_guard_or_decides_known_conditions_and_names_a_missing_torch_api(monkeypatch):
    assert op_args.guard_or(True, False) is True and op_args.guard_or(False, True) is False

    @torch.compile(fullgraph=True, dynamic=True, backend="eager")
    def checked(x):
        op_args.require(x.shape[0] >= 1, lambda: ValueError("x must not be empty"))
        return x + 1

    assert checked(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
    # A PyTorch before guard_or_true (2.8's docs are the first to list it; torch itself uses
    # it, so the test renames what op_args looks up): the compiled call names the API.
    torch._dynamo.reset()
    monkeypatch.setitem(op_args._GUARD_OR_NAMES, True, "guard_or_true_missing")
    with pytest.raises(Exception, match=r"needs torch\.fx\.experimental\.symbolic_shapes"):
        checked(torch.ones(4))
    torch._dynamo.reset()
