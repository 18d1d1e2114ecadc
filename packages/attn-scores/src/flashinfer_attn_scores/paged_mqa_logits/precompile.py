"""`precompile_paged_mqa_logits`: compile every kernel configuration a deployment needs."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from flashinfer_schedule import resolve_device

from .. import _validation as v
from . import launcher
from .problem import (
    FP4_EPI_DTYPES,
    FP4_HEAD_DIM,
    FP4_MAX_NEXT_N,
    FP4_NUM_HEADS,
    FP4_OUTPUT_DTYPES,
    FP8_ACC_DTYPES,
    FP8_BF16_REFUSAL,
    FP8_EPI_DTYPES,
    FP8_OUTPUT_DTYPES,
    check_fp8_shared_memory_fit,
)

__all__ = ["PagedMqaLogitsConfig", "precompile_paged_mqa_logits"]


@dataclass(frozen=True)
class PagedMqaLogitsConfig:
    """One kernel specialisation compiled by `precompile_paged_mqa_logits`.

    Its fields are the call arguments that pick the kernel: `variant` is `"fp8"` or `"fp4"`,
    `acc_dtype` is always float32 for fp4 (its MMA accumulator is fixed), and
    `is_kv_sf_interleaved` is only ever True for fp4 at block size 128. Frozen and hashable,
    so a list of them can be compared or stored.
    """

    variant: str
    block_size: int
    next_n: int
    num_heads: int
    head_dim: int
    output_dtype: torch.dtype
    epi_dtype: torch.dtype
    acc_dtype: torch.dtype
    is_kv_sf_interleaved: bool


_DEFAULT_OUTPUT_DTYPES = {
    "fp8": (torch.float32,),
    "fp4": (torch.bfloat16, torch.float32),
}


def _check_choices(name: str, values: object, of: str, scalar: type | tuple) -> None:
    """`values` must be a non-empty sequence (not a lone `scalar`): TypeError for another
    type, ValueError for an empty one."""
    if isinstance(values, scalar) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a non-empty sequence of {of}, got {values!r}")
    if not values:
        raise ValueError(f"{name} must be a non-empty sequence of {of}, got {values!r}")


def _check_int_tuple(name: str, values: object, allowed: Callable[[int], str | None]) -> tuple:
    _check_choices(name, values, "ints", (str, bytes))
    checked = tuple(v.check_int(f"{name} entry", value) for value in values)
    for value in checked:
        problem = allowed(value)
        if problem:
            raise ValueError(f"{name} entry {value}: {problem}")
    return checked


def _check_dtype_tuple(name: str, values: object) -> tuple:
    _check_choices(name, values, "torch.dtype", torch.dtype)
    for value in values:
        if not isinstance(value, torch.dtype):
            raise TypeError(f"{name} entries must be torch.dtype, got {value!r}")
    return tuple(values)


def _supported(
    variant: str,
    name: str,
    requested: tuple,
    allowed: tuple,
    variant_count: int,
    refusal: dict | None = None,
) -> tuple:
    """The entries of a dtype list that `variant` supports. With several variants a dtype is
    built for those that take it (fp8 has no bfloat16 output); every variant must keep at
    least one, so nothing asked for is silently left out."""
    if variant_count == 1:
        for dtype in requested:
            v.check_dtype_choice(f"{name} ({variant})", dtype, allowed, refusal)
        return requested
    kept = tuple(dtype for dtype in requested if dtype in allowed)
    if not kept:
        names = ", ".join(str(d) for d in allowed)
        raise ValueError(
            f"{name} {tuple(str(d) for d in requested)} leaves nothing to build for {variant}, "
            f"which takes ({names}): add one of those, or leave {variant!r} out of variants"
        )
    return kept


def _paged_configs(
    variants: tuple,
    output_dtypes: tuple | None,
    block_sizes: tuple,
    next_ns: tuple,
    num_heads: int,
    head_dim: int,
    epi_dtypes: tuple,
    acc_dtypes: tuple,
) -> list[PagedMqaLogitsConfig]:
    """Expand the requested grid, checking every combination against the ops' restrictions."""
    distinct = len(set(variants))
    if distinct > 1:
        takes = {
            "output_dtypes": {"fp8": FP8_OUTPUT_DTYPES, "fp4": FP4_OUTPUT_DTYPES},
            "epi_dtypes": {"fp8": FP8_EPI_DTYPES, "fp4": FP4_EPI_DTYPES},
        }
        for name, requested in (("output_dtypes", output_dtypes), ("epi_dtypes", epi_dtypes)):
            for dtype in requested or ():
                if not any(dtype in takes[name][variant] for variant in variants):
                    each = "; ".join(
                        f"{variant}: {', '.join(str(d) for d in takes[name][variant])}"
                        for variant in variants
                    )
                    raise ValueError(
                        f"{name} entry {dtype}: none of the variants {tuple(variants)} takes it "
                        f"({each})"
                    )
    configs: list[PagedMqaLogitsConfig] = []
    for variant in variants:
        outs = output_dtypes if output_dtypes is not None else _DEFAULT_OUTPUT_DTYPES[variant]
        if variant == "fp8":
            allowed_out, allowed_epi, allowed_acc = (
                FP8_OUTPUT_DTYPES,
                FP8_EPI_DTYPES,
                FP8_ACC_DTYPES,
            )
            heads, dim = num_heads, head_dim
        else:
            allowed_out, allowed_epi, allowed_acc = (
                FP4_OUTPUT_DTYPES,
                FP4_EPI_DTYPES,
                (torch.float32,),
            )
            heads, dim = FP4_NUM_HEADS, FP4_HEAD_DIM
        if output_dtypes is not None:
            refusal = FP8_BF16_REFUSAL if variant == "fp8" else None
            outs = _supported(variant, "output_dtypes", outs, allowed_out, distinct, refusal)
        epis = _supported(variant, "epi_dtypes", epi_dtypes, allowed_epi, distinct)
        accs = acc_dtypes if variant == "fp8" else (torch.float32,)
        for dtype in accs:
            v.check_dtype_choice(f"acc_dtypes ({variant})", dtype, allowed_acc)
        for next_n in next_ns:
            if variant == "fp4" and next_n > FP4_MAX_NEXT_N:
                raise ValueError(
                    f"next_ns entry {next_n}: fp4 supports next_n 1..{FP4_MAX_NEXT_N}; "
                    "pass variants=('fp8',) or drop it"
                )
            v.check_head_geometry(heads, dim, next_n)
            if variant == "fp8":
                check_fp8_shared_memory_fit(heads, dim, next_n)
        for block_size, next_n, out_dtype, epi, acc in itertools.product(
            block_sizes, next_ns, outs, epis, accs
        ):
            interleaved = (False, True) if variant == "fp4" and block_size == 128 else (False,)
            configs.extend(
                PagedMqaLogitsConfig(
                    variant=variant,
                    block_size=block_size,
                    next_n=next_n,
                    num_heads=heads,
                    head_dim=dim,
                    output_dtype=out_dtype,
                    epi_dtype=epi,
                    acc_dtype=acc,
                    is_kv_sf_interleaved=inter,
                )
                for inter in interleaved
            )
    return configs


def precompile_paged_mqa_logits(
    device: torch.device | str | int | None = None,
    variants: Sequence[str] = ("fp8", "fp4"),
    output_dtypes: Sequence[torch.dtype] | None = None,
    batch_sizes: Sequence[int] | None = None,
    *,
    block_sizes: Sequence[int] = (32, 64, 128),
    next_ns: Sequence[int] = (1, 2, 3, 4),
    num_heads: int = 64,
    head_dim: int = 128,
    epi_dtypes: Sequence[torch.dtype] = (torch.float32,),
    acc_dtypes: Sequence[torch.dtype] = (torch.float32,),
) -> list[PagedMqaLogitsConfig]:
    """Pre-compile paged MQA logits kernels for common static configs.

    Kernels are compiled at run time (NVRTC, through `flashinfer_jit`) the first time a
    configuration is used and then kept in the on-disk kernel cache. Call this once during
    deployment setup so that no serving request pays for compilation: the kernels are
    compiled and loaded on the device, so the first serving call neither compiles nor loads
    code. Besides the logits kernels, this compiles and loads the schedule kernel that
    `compute_paged_mqa_logits_schedule` launches on CUDA tensors (one configuration, whatever
    the variants). Kernels are compiled for CUDA devices only: on a CPU device (or with no
    GPU present and `device=None`) the arguments are validated and nothing is compiled.

    The grid is every combination of `variants x block_sizes x next_ns x output dtypes x
    epi_dtypes x acc_dtypes` (acc only for fp8), plus the interleaved scale order for fp4 at
    block size 128. fp8 uses `num_heads x head_dim`; fp4 always uses its fixed 64 x 128.

    Args:
        device: Target device. None means the current CUDA device when one is available,
            else the CPU.
        variants: Which precisions to build, a subset of `("fp8", "fp4")`. A deployment
            usually runs one indexer precision; pass e.g. `("fp8",)`.
        output_dtypes: Output dtypes to build. None (default) means float32 for fp8 and
            both bfloat16 and float32 for fp4. With both variants selected each dtype is
            built for the variants that take it (fp8 has no bfloat16 output), and each
            variant must keep at least one; with one variant every entry must suit it.
        batch_sizes: Accepted for source compatibility with FlashInfer's signature; the SM90
            kernels do not specialise on batch size, so the values are only validated
            (positive ints).
        block_sizes: KV block sizes to build, each 32, 64 or 128.
        next_ns: Draft depths to build (fp4 supports 1..4).
        num_heads: fp8 head count (a multiple of 4); fp4 is fixed at 64.
        head_dim: fp8 head dimension (a multiple of 32); fp4 is fixed at 128.
        epi_dtypes: Epilogue dtypes to build, per variant as for `output_dtypes` (fp8 has
            no bfloat16 epilogue).
        acc_dtypes: fp8 accumulator dtypes to build.

    Returns:
        The logits configurations compiled, in build order (the schedule kernel, which has
        no such configuration, is not listed): an empty list on a CPU device.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: A list of choices is empty, a requested configuration violates the ops'
            restrictions, or `device`
            does not name a CPU or visible CUDA device (`flashinfer_schedule.resolve_device`).
        RuntimeError: The target is a GPU other than SM90, or a CUDA target is asked for
            inside a torch.compile trace (a start-up step, not part of a graph).
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    target = resolve_device(device)
    if target.type not in v.SUPPORTED_DEVICE_TYPES:
        raise ValueError(f"device must be a CUDA or CPU device, got {target}")

    _check_choices("variants", variants, "str", str)
    for variant in variants:
        if not isinstance(variant, str):
            raise TypeError(
                f"variants entries must be 'fp8' or 'fp4', got {type(variant).__name__} "
                f"({variant!r})"
            )
        if variant not in ("fp8", "fp4"):
            raise ValueError(f"variants entries must be 'fp8' or 'fp4', got {variant!r}")
    if output_dtypes is not None:
        output_dtypes = _check_dtype_tuple("output_dtypes", output_dtypes)
    if batch_sizes is not None:
        _check_int_tuple("batch_sizes", batch_sizes, lambda b: None if b >= 1 else "must be >= 1")
    block_sizes = _check_int_tuple(
        "block_sizes",
        block_sizes,
        lambda b: None if b in v.SUPPORTED_BLOCK_SIZES else f"must be in {v.SUPPORTED_BLOCK_SIZES}",
    )
    next_ns = _check_int_tuple("next_ns", next_ns, lambda n: None if n >= 1 else "must be >= 1")
    num_heads = v.check_int("num_heads", num_heads)
    head_dim = v.check_int("head_dim", head_dim)
    configs = _paged_configs(
        tuple(variants),
        output_dtypes,
        block_sizes,
        next_ns,
        num_heads,
        head_dim,
        _check_dtype_tuple("epi_dtypes", epi_dtypes),
        _check_dtype_tuple("acc_dtypes", acc_dtypes),
    )
    if target.type == "cpu":
        return []
    if torch.compiler.is_compiling():
        # Worker processes, the disk cache and driver loads cannot be put in a graph.
        raise RuntimeError(
            "precompile_paged_mqa_logits compiles and loads kernels (worker processes, files, "
            "the CUDA driver) and cannot run inside torch.compile; call it once at start-up, "
            "outside the compiled function"
        )
    v.check_cuda_arch("precompile_paged_mqa_logits", target)
    launcher.compile_paged_mqa_logits_kernels(configs, target)
    return configs
