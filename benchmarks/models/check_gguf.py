"""Exit 0 when PATH is a readable GGUF of architecture ARCH with TENSORS tensors, else exit
with the reason (the fetch scripts' check of a joined model file).

    python check_gguf.py PATH ARCH TENSORS
"""

from __future__ import annotations

import sys

from gguf import GGUFReader


def check(path: str, arch: str, tensors: int) -> None:
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit(f"{path}: no GGUF magic")
    reader = GGUFReader(path)
    field = reader.fields["general.architecture"]
    found = bytes(field.parts[field.data[0]]).decode()
    if found != arch:
        sys.exit(f"{path}: architecture {found!r}, expected {arch!r}")
    if len(reader.tensors) != tensors:
        sys.exit(f"{path}: {len(reader.tensors)} tensors, expected {tensors}")


if __name__ == "__main__":
    check(sys.argv[1], sys.argv[2], int(sys.argv[3]))
