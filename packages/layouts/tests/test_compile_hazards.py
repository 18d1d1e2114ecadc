"""Operations the layouts functions avoid because some Triton releases compile them wrong.

Inductor turns the quantisers and dequantisers into Triton code on CUDA. Three operations
are kept out of them, checked here on any machine by tracing each case of `tricky_inputs`
and reading its ATen graph (the GPU test `test_compiled_bytes.py` sees the effect itself):

* a float negation: Triton 3.6 (PyTorch 2.11's) compiles ``-x`` as ``0 - x``, which is
  +0.0 for x = +-0.0, so a decoded E2M1 negative zero (code 0x8) lost its sign;
* a conversion from ``torch.float8_e4m3fn``: Inductor folds float8 -> float32 -> float64 into
  one float8 -> float64 conversion, which Triton 3.6 cannot lower for sm_90 (the FP8 round
  trip failed to compile on the H200);
* a float ``abs`` (defensive: its PTX is a non-flushing ``abs.f32`` today, but the sign-bit
  form `magnitude` leaves no flush-to-zero variant to choose);
* a float64 division by a constant (a Python-number global scale becomes one) whose quotient
  is kept in float64: Inductor compiles it on CUDA as a product with the reciprocal, other
  bytes than eager's division. Rounded at once to float32, as `div_to_float32` does, the
  quotient is the same either way, so that use is allowed.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import flashinfer_layouts as fl
import pytest
import torch
from flashinfer_layouts._bits import e2m1_decode, e4m3_bits_to_float32
from torch.fx.experimental.proxy_tensor import make_fx

# Their checks read tensor data, which a fake-tensor trace cannot (dynamo skips them).
UNTRACEABLE = {"write_fp8_pow2", "write_fp8_amax", "write_mxfp4", "nvfp4_own_global"}
FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}
CONVERSIONS = {torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default}


def traced_graph(case):
    inputs = []
    case(lambda t: inputs.append(t) or t)

    def replay(*args):
        given = iter(args)
        out = case(lambda _: next(given))
        return tuple(out) if isinstance(out, (tuple, list)) else out

    return make_fx(replay, tracing_mode="fake", _allow_non_fake_inputs=True)(*inputs).graph


def depends_on_an_input(node) -> bool:
    """Whether an FX value is computed from a placeholder (else it is a constant to Inductor)."""
    if not isinstance(node, torch.fx.Node):
        return False
    seen, todo = set(), [node]
    while todo:
        current = todo.pop()
        if current.op == "placeholder":
            return True
        seen.add(current)
        todo.extend(n for n in current.all_input_nodes if n not in seen)
    return False


def rounded_to_float32_at_once(node) -> bool:
    return bool(node.users) and all(
        user.target in CONVERSIONS and user.meta["val"].dtype == torch.float32
        for user in node.users
    )


def hazards(graph) -> list[str]:
    found = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if (
            node.target is torch.ops.aten.div.Tensor
            and node.meta["val"].dtype == torch.float64
            and not depends_on_an_input(node.args[1])
            and not rounded_to_float32_at_once(node)
        ):
            found.append(f"{node.format_node()} (a float64 division by a constant)")
        if node.target is torch.ops.aten.neg.default:
            found.append(f"{node.format_node()} (a negation)")
        if node.target is torch.ops.aten.abs.default:
            found.append(f"{node.format_node()} (an abs)")
        if node.target in CONVERSIONS:
            source = node.args[0].meta["val"].dtype
            if source in FLOAT8 and node.meta["val"].dtype not in FLOAT8:
                found.append(f"{node.format_node()} (a conversion from {source})")
    return found


def case_names():
    import tricky_inputs

    names = tricky_inputs.tricky_cases(tricky_inputs.tricky_rows())
    return sorted(n for n in names if n not in UNTRACEABLE)


@pytest.mark.parametrize("name", case_names())
def test_traced_case_avoids_the_hazards(tricky_cases, name):
    assert hazards(traced_graph(tricky_cases[name])) == []


def test_msa_pages_avoid_the_hazards(tricky_rows):
    tile = torch.arange(128 * 8, dtype=torch.int32).remainder(256).to(torch.uint8)
    graph = traced_graph(lambda t: fl.dequantize_msa_v_scales(t(tile.reshape(128, 8))))
    assert hazards(graph) == []
    k = tricky_rows.repeat(32, 1).reshape(1, 2, 128, 128)
    pages = fl.pack_nvfp4_msa_pages(k, k.flip(-1), 2.0, 0.5)
    assert hazards(traced_graph(lambda t: fl.pack_nvfp4_msa_pages(t(k), t(k), 2.0, 0.5))) == []
    assert hazards(traced_graph(lambda t: fl.unpack_nvfp4_msa_pages(t(pages), 2, 2.0, 0.5))) == []


def test_the_hazard_check_finds_each_operation():
    """The check itself: a float8 widening, a negation and an abs are reported."""
    codes = torch.tensor([0x08, 0x38], dtype=torch.uint8)
    graph = traced_graph(lambda t: (-t(codes).view(torch.float8_e4m3fn).to(torch.float32)).abs())
    assert [h.rsplit("(", 1)[1] for h in hazards(graph)] == [
        "a conversion from torch.float8_e4m3fn)",
        "a negation)",
        "an abs)",
    ]


def test_the_hazard_check_finds_a_float64_division_by_a_constant():
    x = torch.arange(1, 9, dtype=torch.float64)

    def divide(t, keep):
        quotient = t(x) / torch.tensor(0.37, dtype=torch.float64)
        return quotient if keep else quotient.to(torch.float32)

    found = hazards(traced_graph(lambda t: divide(t, keep=True)))
    assert [h.rsplit("(", 1)[1] for h in found] == ["a float64 division by a constant)"]
    assert hazards(traced_graph(lambda t: divide(t, keep=False))) == []
    assert hazards(traced_graph(lambda t: t(x) / t(x).flip(0))) == []


def e4m3_reference(byte: int) -> float:
    """The E4M3 (fn) value of a byte from the format's definition: bias 7, no infinities,
    S.1111.111 is NaN."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return float("nan")
    if exponent == 0:
        return sign * float(Fraction(mantissa, 8) * Fraction(1, 2**6))
    return sign * float((1 + Fraction(mantissa, 8)) * Fraction(2) ** (exponent - 7))


def test_e4m3_bits_to_float32_gives_every_byte_its_value():
    got = e4m3_bits_to_float32(torch.arange(256, dtype=torch.int32).to(torch.uint8))
    for byte, value in enumerate(got.tolist()):
        expected = e4m3_reference(byte)
        word = struct.unpack("<I", struct.pack("<f", value))[0]
        if expected != expected:  # NaN: PyTorch's CPU cast's pattern, with the byte's sign
            assert word == (0x7FF00000 | (byte & 0x80) << 24), hex(byte)
        else:
            assert value == expected and (word >> 31) == (byte >> 7), hex(byte)


def test_e4m3_bits_to_float32_agrees_with_the_cast():
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    cast = bits.view(torch.float8_e4m3fn).to(torch.float32)
    assert torch.equal(e4m3_bits_to_float32(bits).view(torch.int32), cast.view(torch.int32))


def test_e4m3_bits_to_float32_keeps_the_shape_of_a_strided_input():
    generator = torch.Generator().manual_seed(7)
    bits = torch.randint(0, 256, (5, 6, 7), dtype=torch.uint8, generator=generator)
    strided = bits.transpose(0, 2)[::2]
    got = e4m3_bits_to_float32(strided)
    cast = strided.contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    assert got.shape == strided.shape
    assert torch.equal(got.view(torch.int32), cast.view(torch.int32))


def test_e4m3_bits_to_float32_refuses_anything_but_bytes():
    for tensor in (torch.ones(4, dtype=torch.float8_e4m3fn), torch.ones(4, dtype=torch.int32)):
        with pytest.raises(TypeError, match=f"uint8 E4M3 bytes; got dtype {tensor.dtype}"):
            e4m3_bits_to_float32(tensor)


def e2m1_reference(code: int) -> float:
    """The OCP MX value of an E2M1 nibble, from its fields: 1 sign, 2 exponent (bias 1), 1
    mantissa bit; exponent 0 is subnormal (0 or 0.5)."""
    sign = -1.0 if code & 0x8 else 1.0
    exponent, mantissa = (code >> 1) & 0x3, code & 0x1
    if exponent == 0:
        return sign * mantissa * 0.5
    return sign * (1 + mantissa * 0.5) * 2.0 ** (exponent - 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_e2m1_decode_gives_every_nibble_its_value_and_sign(dtype):
    # High nibbles are ignored; a strided 2-D input keeps its shape.
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(16, 16).t()
    got = e2m1_decode(codes, dtype)
    assert got.dtype == dtype and got.shape == codes.shape
    for code, value in zip(codes.flatten().tolist(), got.flatten().tolist(), strict=True):
        expected = e2m1_reference(code & 0xF)
        assert value == expected, hex(code)
        assert math.copysign(1.0, value) == math.copysign(1.0, expected), hex(code)


def test_decoded_e2m1_negative_zero_keeps_its_sign():
    packed = torch.full((1, 16), 0x88, dtype=torch.uint8)  # every element code 0x8 (-0.0)
    scales = torch.full((1, 1), 127, dtype=torch.uint8)  # UE8M0 2**0
    for values in (
        fl.dequantize_mxfp4(packed, scales),
        fl.nvfp4_dequantize(
            packed, torch.full((1, 1), 0x38, dtype=torch.uint8), 1.0, sf_vec_size=32, swizzled=False
        ),
    ):
        assert torch.equal(values, torch.zeros_like(values)) and torch.signbit(values).all()
