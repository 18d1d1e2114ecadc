# Hash the cubin of every fp8 float16-epilogue configuration at H=64 (sys.argv[1]: tree root).
import hashlib, sys, tempfile
sys.path[:0] = [f"{sys.argv[1]}/packages/{p}/src" for p in ("attn-scores", "jit", "schedule", "layouts")]
import flashinfer_attn_scores
assert flashinfer_attn_scores.__file__.startswith(sys.argv[1]), flashinfer_attn_scores.__file__
from flashinfer_attn_scores.paged_mqa_logits.fp8_sm90 import all_kernel_specs
from flashinfer_jit.compiler import compile_kernel
with tempfile.TemporaryDirectory() as d:
    for s in all_kernel_specs():
        if "H=64" in s.label and "epi=float16" in s.label:
            k = compile_kernel(s, "sm_90a", cache_dir=d)
            text = hashlib.sha1(k.cubin).hexdigest()[:12]
            print(s.label, text)
