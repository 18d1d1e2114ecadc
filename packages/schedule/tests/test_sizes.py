import pytest
import torch
from flashinfer_schedule import min_block_table_width, padded_seq_len


@pytest.mark.parametrize(
    ("max_seq_len", "expected"),
    [(0, 0), (1, 256), (255, 256), (256, 256), (257, 512), (8000, 8192), (8192, 8192)],
)
def test_padded_seq_len_rounds_up_to_256(max_seq_len, expected):
    assert padded_seq_len(max_seq_len) == expected


def test_padded_seq_len_rejects_negative():
    with pytest.raises(ValueError, match=r"max_seq_len must be >= 0, got -1"):
        padded_seq_len(-1)


@pytest.mark.parametrize("bad", [True, 8000.0, "8000", None])
def test_padded_seq_len_rejects_non_int(bad):
    with pytest.raises(TypeError, match="max_seq_len must be an int"):
        padded_seq_len(bad)


@pytest.mark.parametrize(
    ("seq_len", "block_size", "expected"),
    [(8000, 32, 250), (0, 32, 0), (1, 128, 1), (128, 128, 1), (129, 128, 2), (257, 64, 5)],
)
def test_min_block_table_width_is_ceil(seq_len, block_size, expected):
    assert min_block_table_width(seq_len, block_size) == expected


@pytest.mark.parametrize(
    ("seq_len", "block_size", "error", "match"),
    [
        (-1, 32, ValueError, "seq_len must be >= 0"),
        (10, 0, ValueError, "block_size must be >= 1"),
        (10, -32, ValueError, "block_size must be >= 1"),
        (True, 32, TypeError, "seq_len must be an int"),
        (10, False, TypeError, "block_size must be an int"),
        (10.0, 32, TypeError, "seq_len must be an int"),
    ],
)
def test_min_block_table_width_rejects(seq_len, block_size, error, match):
    with pytest.raises(error, match=match):
        min_block_table_width(seq_len, block_size)


def test_numpy_integers_are_accepted():
    np = pytest.importorskip("numpy")
    assert padded_seq_len(np.int64(8000)) == 8192
    assert min_block_table_width(np.int32(8000), np.int64(32)) == 250
    assert type(padded_seq_len(np.int64(1))) is int


@pytest.mark.parametrize("bad", ["bool_", "float64"])
def test_numpy_non_integers_are_refused_with_qualified_type(bad):
    np = pytest.importorskip("numpy")
    value = {"bool_": np.bool_(True), "float64": np.float64(8000.0)}[bad]
    name = type(value).__name__
    with pytest.raises(TypeError, match=rf"max_seq_len must be an int, got numpy\.{name} "):
        padded_seq_len(value)


@pytest.mark.parametrize(
    "bad", [torch.tensor(8000), torch.tensor([8000], dtype=torch.int32)], ids=["0-D", "1-elem"]
)
def test_integer_tensors_are_refused(bad):
    # A tensor has __index__, but it is not an int: on CUDA reading it is a host sync.
    with pytest.raises(TypeError, match=r"max_seq_len must be an int, got torch\.Tensor"):
        padded_seq_len(bad)
    with pytest.raises(TypeError, match=r"seq_len must be an int, got torch\.Tensor"):
        min_block_table_width(bad, 32)
    with pytest.raises(TypeError, match=r"block_size must be an int, got torch\.Tensor"):
        min_block_table_width(8000, bad)


def test_a_tensor_size_error_says_how_to_pass_it():
    # The spec writes min_block_table_width(max(seq_lens), block_size); max() of a tensor is a
    # 0-d tensor, so the error tells the caller what to pass instead.
    seq_lens = torch.tensor([5, 8000], dtype=torch.int32)
    with pytest.raises(TypeError, match=r"got torch\.Tensor .*; pass a Python int such as int\("):
        min_block_table_width(max(seq_lens), 32)
    assert min_block_table_width(int(max(seq_lens)), 32) == 250


def test_numpy_zero_d_arrays_are_refused():
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match=r"max_seq_len must be an int, got numpy\.ndarray"):
        padded_seq_len(np.array(8000))


def test_sizes_read_from_device_data_inside_a_compiled_function():
    """`padded_seq_len(int(seq_lens.max()))` sizes an `out=` buffer inside torch.compile: the
    value is known only at run time, so the >= 0 checks run with the compiled code."""

    def sizes(seq_lens):
        longest = int(seq_lens.max().item())
        out = torch.zeros(2, padded_seq_len(longest))
        return out, min_block_table_width(longest, 64)

    compiled = torch.compile(sizes, fullgraph=True)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        for lengths, padded, width in (([5, 300], 512, 5), ([256, 0], 256, 4), ([0], 0, 0)):
            out, got_width = compiled(torch.tensor(lengths, dtype=torch.int32))
            assert out.shape == (2, padded) and got_width == width
        with pytest.raises(RuntimeError, match=r">= 0"):
            compiled(torch.tensor([-5, -9], dtype=torch.int32))
    # Each helper's own check, so that losing either one shows.
    for helper in (padded_seq_len, lambda n: min_block_table_width(n, 64)):
        one = torch.compile(lambda s, helper=helper: helper(int(s.max().item())), fullgraph=True)
        with torch._dynamo.config.patch(capture_scalar_outputs=True):
            with pytest.raises(RuntimeError, match=r">= 0"):
                one(torch.tensor([-5, -9], dtype=torch.int32))


def test_a_nested_tensor_for_a_size_is_a_type_error_naming_it():
    """A nested tensor has no sizes to print; the TypeError names its rank instead."""
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(TypeError, match=r"max_seq_len must be an int, got torch\.Tensor .*2-D"):
        padded_seq_len(nested)
