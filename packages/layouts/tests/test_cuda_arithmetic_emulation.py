"""CPU stand-in for the CUDA arithmetic that differs from the CPU kernels.

PyTorch's CUDA ``div`` turns ``tensor / python_number`` into ``tensor * (1 / python_number)``
(``div_true_kernel_cuda``, ``BinaryDivTrueKernel.cu``: "this may lose one bit of precision"),
where the CPU kernel divides; and on recent CUDA versions its float32 -> float8_e4m3fn copy
is the saturating ``__nv_cvt_float_to_fp8`` intrinsic. Running every quantiser and packer
under a mode that does the same on the CPU must not change a single byte: that is the
CPU/CUDA parity promise, checked without a GPU. (Before the fix, the fp8 "amax" scales were
``amax / 448`` and changed in the last bit here, as they did on the H200.)
"""

from __future__ import annotations

import flashinfer_layouts as fl
import pytest
import torch
from torch.overrides import TorchFunctionMode

_DIVISIONS = {
    torch.div,
    torch.divide,
    torch.true_divide,
    torch.Tensor.div,
    torch.Tensor.divide,
    torch.Tensor.true_divide,
    torch.Tensor.__truediv__,
    torch.Tensor.div_,
    torch.Tensor.__itruediv__,
}
_IN_PLACE = {torch.Tensor.div_, torch.Tensor.__itruediv__}


class CudaArithmetic(TorchFunctionMode):
    """Division by a Python number as a reciprocal multiply; saturating float32 -> E4M3."""

    def __init__(self) -> None:
        super().__init__()
        self.scalar_divisions = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DIVISIONS and self._divides_by_number(args, kwargs):
            self.scalar_divisions += 1
            a, b = args[0], float(args[1])
            opmath = torch.float64 if a.dtype == torch.float64 else torch.float32
            inverse = torch.tensor(1.0, dtype=opmath) / torch.tensor(b, dtype=opmath)
            out = (a.to(opmath) * inverse).to(a.dtype)
            return a.copy_(out) if func in _IN_PLACE else out
        if func is torch.Tensor.to and self._casts_float32_to_e4m3(args, kwargs):
            a = args[0]
            saturated = torch.where(torch.isnan(a), a, a.clamp(-448.0, 448.0))
            return func(saturated, *args[1:], **kwargs)
        return func(*args, **kwargs)

    @staticmethod
    def _divides_by_number(args, kwargs) -> bool:
        return (
            len(args) >= 2
            and isinstance(args[0], torch.Tensor)
            and args[0].is_floating_point()
            and isinstance(args[1], (int, float))
            and not isinstance(args[1], bool)
            and kwargs.get("rounding_mode") is None
        )

    @staticmethod
    def _casts_float32_to_e4m3(args, kwargs) -> bool:
        target = kwargs.get("dtype", args[1] if len(args) > 1 else None)
        return (
            isinstance(args[0], torch.Tensor)
            and args[0].dtype == torch.float32
            and target == torch.float8_e4m3fn
        )


def assert_same(expected, got, label: str) -> None:
    """Same dtypes, shapes and raw bytes (so -0.0 != 0.0 and NaN payloads count)."""
    if isinstance(expected, torch.Tensor):
        assert expected.dtype == got.dtype and expected.shape == got.shape, label
        raw_expected = expected.reshape(-1).view(torch.uint8)
        assert torch.equal(raw_expected, got.reshape(-1).view(torch.uint8)), label
        return
    assert len(expected) == len(got), label
    for i, (e, g) in enumerate(zip(expected, got)):
        assert_same(e, g, f"{label}[{i}]")


def make_inputs():
    gen = torch.Generator().manual_seed(51)  # the data of the GPU parity test
    x = torch.randn(4, 64, 128, generator=gen) * 10.0 ** (
        torch.rand(4, 64, 1, generator=gen) * 6 - 3
    )
    q = torch.randn(2, 3, 64, 128, generator=gen)
    k = torch.randn(2, 4, 128, 128, generator=gen)
    v = torch.randn(2, 4, 128, 128, generator=gen)
    return x, q, k, v


X, Q, K, V = make_inputs()
CASES = {
    "fp8_pow2": lambda: fl.quantize_fp8_per_token(X),
    "fp8_amax": lambda: fl.quantize_fp8_per_token(X, scale_mode="amax"),
    "fp8_amax_bf16": lambda: fl.quantize_fp8_per_token(X.bfloat16(), scale_mode="amax"),
    "fp8_amax_f64": lambda: fl.quantize_fp8_per_token(X.double(), scale_mode="amax"),
    "fp8_dequant": lambda: fl.dequantize_fp8_kv_cache(
        fl.pack_fp8_kv_cache(*fl.quantize_fp8_per_token(X, scale_mode="amax")),
        dtype=torch.float16,
    ),
    "mxfp4": lambda: fl.quantize_mxfp4(X),
    "mxfp4_dequant": lambda: fl.dequantize_mxfp4(*fl.quantize_mxfp4(X), dtype=torch.bfloat16),
    "mxfp4_q": lambda: fl.dequantize_mxfp4_q(*fl.quantize_mxfp4_q(Q)),
    "mxfp4_kv": lambda: fl.unpack_mxfp4_kv_cache(
        fl.quantize_mxfp4_kv_cache(X[:2].reshape(1, 128, 128), interleaved=True),
        interleaved=True,
    ),
    "nvfp4_global": lambda: fl.nvfp4_global_scale(X),
    "nvfp4": lambda: fl.nvfp4_quantize(X.reshape(-1, 128), fl.nvfp4_global_scale(X)),
    "nvfp4_linear": lambda: fl.nvfp4_quantize(X.reshape(-1, 128), 7.0, swizzled=False),
    "nvfp4_sf32": lambda: fl.nvfp4_quantize(X.reshape(-1, 128), 3.3, sf_vec_size=32),
    "nvfp4_dequant": lambda: fl.nvfp4_dequantize(
        *fl.nvfp4_quantize(X.reshape(-1, 128), 7.0), 7.0, dtype=torch.float16
    ),
    "msa_pages": lambda: fl.unpack_nvfp4_msa_pages(
        fl.pack_nvfp4_msa_pages(K, V, 30.0, torch.tensor(40.0)), 4, 30.0, 40.0
    ),
}


def write_both():
    pools = []
    slots = torch.tensor([3, -1, 200, 17, -1])
    for mode in ("pow2", "amax"):
        pool = torch.zeros(4, 64, 1, 132, dtype=torch.uint8)
        fl.write_fp8_kv_cache(pool, X[0, :5], slots, scale_mode=mode)
        pools.append(pool)
    pool = torch.zeros(4, 128, 1, 68, dtype=torch.uint8)
    fl.write_mxfp4_kv_cache(pool, X[1, :5], slots, interleaved=True)
    return [*pools, pool]


CASES["write"] = write_both


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_do_not_change_under_cuda_arithmetic(name):
    expected = CASES[name]()
    with CudaArithmetic():
        got = CASES[name]()
    assert_same(expected, got, name)


def test_tricky_rows_do_not_change_under_cuda_arithmetic(tricky_cases):
    for name, case in tricky_cases.items():
        expected = case(lambda a: a)
        with CudaArithmetic():
            got = case(lambda a: a)
        assert_same(expected, got, name)


def test_the_stand_in_reproduces_the_cuda_difference():
    # Guards the test above against a stand-in that changes nothing: the old fp8 "amax" scale
    # ``amax / 448`` differs in the last bit for most rows of the parity data.
    amax = X.abs().amax(-1)
    with CudaArithmetic() as mode:
        by_reciprocal = amax / 448.0
        saturated = torch.tensor([500.0, -1e30]).to(torch.float8_e4m3fn)
    assert mode.scalar_divisions == 1
    assert (by_reciprocal != amax / 448.0).sum() > 0.25 * amax.numel()
    assert saturated.view(torch.uint8).tolist() == [0x7E, 0xFE]
