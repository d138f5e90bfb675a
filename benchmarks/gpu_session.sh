#!/usr/bin/env bash
# The GPU checks of one device session, in two calls on the same warm machine (the device tool
# carries 64 MiB per call; SmolLM2's GGUF alone is 98 MB, so it travels in two halves):
#
#   bash benchmarks/gpu_session.sh a   # carry .gpu/site.tgz .gpu/m.part1 .gpu/data
#       the gpu-marked tests; the decode harness on a Llama-1B-shaped random model
#   bash benchmarks/gpu_session.sh b   # carry .gpu/m.part2 (call a left m.part1 in /tmp)
#       SmolLM2 in bfloat16: batch-1 speculation (goodput with and without its rest, and
#       fixed), the decode harness,
#       engine throughput, the in-process policy sweep, step costs by phase, the goodput probe
#       (also with the runner's phases timed)
# ONLY="name ..." runs only those parts, SKIP="name ..." all but those; ENGINE_ROUNDS=3 runs the
# engine throughput (this checkout, then the base's) three times; SWEEP_SEEDS="0 1" runs
# the policy sweep once per seed, SWEEP_POLICIES="off,goodput" with those policies, and
# SWEEP_ARGS="--workloads chat --num-prompts 32" adds (or overrides) its arguments. A call's carried paths
# are removed before the next call, so call a copies what call b needs into /tmp, which
# lasts as long as the machine stays warm (30 s between calls).
#
# Prepare on the CPU machine with `bash benchmarks/gpu_prepare.sh` (the slim site: FlashInfer
# without its JIT sources, its attention kernels compiled ahead for sm_90a, tvm-ffi, gguf).
# Results: $OUT/log_<mode>.txt and $OUT/results_<mode>.tgz (json + md per part; rewritten after
# every part, so a call cut short still brings back what finished).
set -uo pipefail
cd "$(dirname "$0")/.."
MODE="${1:?mode a or b}"
OUT="${OUT:-/tmp/gpu_out}"
R="/tmp/results_$MODE"
mkdir -p "$R" "$OUT"
exec > >(tee -a "$OUT/log_$MODE.txt") 2>&1

SITE=/tmp/site
if [ ! -d "$SITE/flashinfer" ]; then
    mkdir -p "$SITE" && tar xzf .gpu/site.tgz -C "$SITE" || echo "no site: call a did not run here"
fi
export PYTHONPATH="$SITE:$PWD" FLASHINFER_DISABLE_JIT=1 PYTHONUNBUFFERED=1
MODEL=/tmp/smollm2.gguf

part() {  # part NAME SECONDS COMMAND...: run with a time limit, log its time and status
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    case " ${SKIP:-} " in *" $name "*) echo "=== $name: skipped"; return ;; esac
    if [ -n "${ONLY:-}" ]; then
        case " $ONLY " in *" $name "*) ;; *) echo "=== $name: not in ONLY"; return ;; esac
    fi
    echo "=== $name (limit ${limit}s) $(date -u +%T)"
    timeout "$limit" "$@"
    echo "=== $name: exit $? in $((SECONDS - start)) s"
    tar czf "$OUT/results_$MODE.tgz" -C /tmp "results_$MODE"
}

if [ "$MODE" = a ]; then
    # Carried paths are gone at the next call; what call b needs waits in /tmp.
    cp .gpu/m.part1 /tmp/m.part1 && rm -rf /tmp/gpu_data && cp -r .gpu/data /tmp/gpu_data
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c 'import torch, flashinfer; print("torch", torch.__version__, "flashinfer", flashinfer.__version__)'
    part tests 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_fused.py \
        tests/kernels/test_flashinfer_gpu.py tests/e2e/test_gpu_engine.py \
        --junitxml="$R/gpu_tests.xml"
    # The decoder's small ops as Triton kernels (default) and as PyTorch ops (GOODSPEED_TRITON=0)
    for variant in torch triton; do
        part "bench-1b-$variant" 120 env GOODSPEED_TRITON="$([ $variant = torch ] && echo 0 || echo 1)" \
            python3 benchmarks/gpu_bench.py --out "$R" --name "llama1b_$variant" \
            --backends flashinfer,flashinfer+graphs --batch-sizes 1,8,64
    done
else
    [ -f .gpu/m.part2 ] && cat /tmp/m.part1 .gpu/m.part2 >"$MODEL"
    sha256sum "$MODEL"
    DATA=(--data /tmp/gpu_data)
    # A fresh machine compiles the Triton kernels at their first use (likely why the first
    # harness of 2026-11-28's lease 2, whose call a ran no tests, took 73 s against 17 s):
    # compile them once, results dropped, whatever ONLY and SKIP say.
    if [ ! -d "$HOME/.triton/cache" ]; then
        echo "=== warm-up $(date -u +%T)"
        mkdir -p /tmp/warm
        timeout 150 python3 benchmarks/gpu_bench.py --out /tmp/warm --name warm --model "$MODEL" \
            --backends flashinfer+graphs --batch-sizes 1,8 >/dev/null
        echo "=== warm-up: exit $? $(date -u +%T)"
    fi
    SPEC=(--model "$MODEL" --device cuda --dtype bfloat16 "${DATA[@]}" --num-prompts 4
        --max-tokens 128 --configs off,ngram-chain --workloads copy,chat)
    part spec-goodput 120 python3 benchmarks/spec_bench.py "${SPEC[@]}" --policy goodput \
        --out "$R/spec_goodput.json" --markdown "$R/spec_goodput.md"
    # The same with goodput planning every step: what the rest (control/rest.py) does to chat
    part spec-goodput-norest 120 python3 benchmarks/spec_bench.py "${SPEC[@]}" --policy goodput \
        --no-rest --out "$R/spec_goodput_norest.json" --markdown "$R/spec_goodput_norest.md"
    for variant in torch triton; do  # GOODSPEED_TRITON=0: the small ops as PyTorch ops
        flag="$([ $variant = torch ] && echo 0 || echo 1)"
        part "bench-smollm2-$variant" 100 env GOODSPEED_TRITON="$flag" python3 \
            benchmarks/gpu_bench.py --out "$R" --name "smollm2_$variant" --model "$MODEL" \
            --backends flashinfer,flashinfer+graphs --batch-sizes 1,8,32,64
        # ENGINE_ROUNDS > 1: this checkout's engine and the base's take turns that many times
        for round in $(seq 1 "${ENGINE_ROUNDS:-1}"); do
            suffix="$([ "$round" = 1 ] && echo "" || echo "_r$round")"
            mkdir -p "$R/engine_$variant$suffix"
            part "engine-$variant" 90 env GOODSPEED_TRITON="$flag" python3 \
                benchmarks/gpu_checks.py --model "$MODEL" "${DATA[@]}" \
                --out "$R/engine_$variant$suffix" --parts throughput --throughput-engines fi-graphs
            if [ -d .gpu/base ] && [ $variant = triton ]; then
                mkdir -p "$R/engine_base$suffix"
                part engine-base 90 env PYTHONPATH="$SITE:$PWD/.gpu/base" python3 \
                    .gpu/base/benchmarks/gpu_checks.py --model "$MODEL" "${DATA[@]}" \
                    --out "$R/engine_base$suffix" --parts throughput --throughput-engines fi-graphs
            fi
        done
    done
    # The sweep once per seed in SWEEP_SEEDS; with a base checkout carried in .gpu/base (its
    # engine, kernels, benchmarks, server and tests: `git archive REV engine kernels benchmarks
    # server tests`; gpu_checks.py imports tests.parity), the base's sweep and engine
    # throughput take turns with this checkout's, on the same machine.
    for seed in ${SWEEP_SEEDS:-0}; do
        part "sweep-s$seed" 150 python3 benchmarks/engine_sweep.py --model "$MODEL" \
            --device cuda --dtype bfloat16 "${DATA[@]}" --policies "${SWEEP_POLICIES:-off,goodput,fixed:3}" \
            --multipliers 1,4,16 --num-prompts 16 --max-tokens 64 --seed "$seed" \
            ${SWEEP_REPEATS:+--repeats "$SWEEP_REPEATS"} ${SWEEP_ARGS:-} --out "$R/sweep_s$seed.json"
        [ -d .gpu/base ] && part "sweep-base-s$seed" 150 python3 .gpu/base/benchmarks/engine_sweep.py \
            --model "$MODEL" --device cuda --dtype bfloat16 "${DATA[@]}" \
            --policies off,goodput --multipliers 1,4,16 --num-prompts 16 --max-tokens 64 \
            --seed "$seed" ${SWEEP_ARGS:-} --out "$R/sweep_base_s$seed.json"
    done
    part costs 150 python3 benchmarks/spec_step_costs.py --model "$MODEL" --device cuda \
        --dtype bfloat16 "${DATA[@]}" --concurrency 1 4 16 64 --rounds "${COST_ROUNDS:-2}" \
        --out "$R/step_costs.json"  # a speculating step against a plain one, by phase
    part spec-fixed 90 python3 benchmarks/spec_bench.py "${SPEC[@]}" --policy fixed \
        --out "$R/spec_fixed.json" --markdown "$R/spec_fixed.md"
    part bench-smollm2-again 100 python3 benchmarks/gpu_bench.py --out "$R" \
        --name smollm2_triton_again --model "$MODEL" --backends flashinfer+graphs \
        --batch-sizes 1,8,32,64  # the harness once more, for its drift over the call
    part phases 60 python3 benchmarks/graph_step_phases.py --model "$MODEL" \
        --out "$R/graph_step_phases.json"
    part probe 90 python3 benchmarks/goodput_probe.py --model "$MODEL" --device cuda \
        --dtype bfloat16 "${DATA[@]}" --out "$R/goodput_probe.json"
    # The same with the runner's phases synced per step: which part stalls on the first
    # drafting steps of a token count at 16 requests (docs/benchmarks.md §4j)
    part probe-phases 90 python3 benchmarks/goodput_probe.py --model "$MODEL" --device cuda \
        --dtype bfloat16 "${DATA[@]}" --phases --out "$R/goodput_probe_phases.json"
fi
echo "done $(date -u +%T)"
