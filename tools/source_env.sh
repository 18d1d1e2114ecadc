# Sourced by the device scripts under tools/: run from the repository root with the packages
# imported from their src/ folders (the device image has no package registry) and one kernel
# cache for every command of a call.
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
# Absolute paths: a test's subprocess may run in another folder.
export PYTHONPATH=$PWD/packages/layouts/src:$PWD/packages/jit/src:$PWD/packages/schedule/src:$PWD/packages/attn-scores/src${PYTHONPATH:+:$PYTHONPATH}
export FLASHINFER_JIT_CACHE_DIR=${FLASHINFER_JIT_CACHE_DIR:-/tmp/flashinfer-jit-cache}
