#!/usr/bin/env bash
# A lent GPU's whole session in one command: a lease is minutes, so everything runs here in
# one go, each step capped, each writing into $OUT as it goes (a step cut short keeps what it
# had). From the repository root, on the GPU machine:
#
#     OUT=/tmp/gpu bash packages/craft-eval/benchmarks/gpu_session.sh
#
# 1. the gpu-marked tests of craft-core, craft-adapters and craft-eval (`-x`, one pytest each);
# 2. compression alone (bench_gpu.py part 1: exact, fast and CUDA-graph runners, a batch of 8
#    videos in one call, DivPrune, one pairing pass; N = 6,272 / 16,384 / 65,536);
# 3. end to end (bench_gpu.py part 2: Qwen3.5-4B and Qwen2.5-VL-7B at real size, random
#    weights, bf16, 64 frames, uncompressed / 8x / 16x).
# Python packages the machine lacks travel as wheels in .whl/ (installed into /tmp/site).
# `CAP_TESTS`, `CAP_COMPRESSION`, `CAP_END_TO_END` are each step's seconds; a dry run on a
# CPU: `WHEELS= BENCH_ARGS="--quick --device cpu" GRAPHS= bash .../gpu_session.sh`.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
WHEELS=${WHEELS-.whl}
if [ -n "$WHEELS" ] && compgen -G "$WHEELS/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHEELS"/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
for package in craft-core craft-adapters craft-eval craft-train craft-world; do
    PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}packages/$package/src
done
export PYTHONPATH PYTHONUNBUFFERED=1 CRAFT_GPU_TESTS=1 HF_HUB_OFFLINE=1
LOG="$OUT/gpu_tests.log"
{
    nvidia-smi -L
    python3 - <<'EOF'
import importlib.util, torch, transformers
fast = {m: importlib.util.find_spec(m) is not None for m in ("fla", "causal_conv1d")}
print("torch", torch.__version__, "transformers", transformers.__version__, "kernels", fast)
EOF
} >"$LOG" 2>&1
for package in craft-core craft-adapters craft-eval; do
    echo "=== $package" >>"$LOG"
    timeout "${CAP_TESTS:-100}" python3 -m pytest "packages/$package/tests" -m gpu -x -q \
        -p no:cacheprovider -W ignore::DeprecationWarning >>"$LOG" 2>&1
    echo "=== $package exit $?" >>"$LOG"
done
BENCH=packages/craft-eval/benchmarks/bench_gpu.py
GRAPHS=${GRAPHS---variant graphs=cuda_graphs=true}
# shellcheck disable=SC2086  # BENCH_ARGS and GRAPHS are word lists
timeout "${CAP_COMPRESSION:-150}" python3 "$BENCH" --out "$OUT" --parts compression \
    --variant exact= --variant fast=precision=fast $GRAPHS --repeats 3 ${BENCH_ARGS:-} \
    >"$OUT/compression.log" 2>&1
echo "compression exit $?" >>"$OUT/compression.log"
# shellcheck disable=SC2086
timeout "${CAP_END_TO_END:-200}" python3 "$BENCH" --out "$OUT" --parts end_to_end \
    --variant exact= --variant fast=precision=fast --repeats 3 ${BENCH_ARGS:-} \
    >"$OUT/end_to_end.log" 2>&1
echo "end_to_end exit $?" >>"$OUT/end_to_end.log"
