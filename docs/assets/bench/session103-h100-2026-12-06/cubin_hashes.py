"""Print the sha1 of every float16-epilogue fp8 cubin at 64 heads, compiled for sm_90a with
NVRTC from the tree given as the first argument (no GPU needed).

    python cubin_hashes.py /path/to/tree > hashes.txt
"""

import hashlib
import importlib
import sys
import tempfile

PACKAGES = ("attn-scores", "jit", "schedule", "layouts")


def main(root: str) -> None:
    sys.path[:0] = [f"{root}/packages/{name}/src" for name in PACKAGES]
    fp8_sm90 = importlib.import_module("flashinfer_attn_scores.paged_mqa_logits.fp8_sm90")
    compiler = importlib.import_module("flashinfer_jit.compiler")
    if not fp8_sm90.__file__.startswith(root):
        raise SystemExit(f"imported {fp8_sm90.__file__}, not the tree at {root}")
    with tempfile.TemporaryDirectory() as cache:
        for spec in fp8_sm90.all_kernel_specs():
            if "H=64" in spec.label and "epi=float16" in spec.label:
                cubin = compiler.compile_kernel(spec, "sm_90a", cache_dir=cache).cubin
                print(spec.label, hashlib.sha1(cubin).hexdigest()[:12])


if __name__ == "__main__":
    main(sys.argv[1])
