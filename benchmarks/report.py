"""What every benchmark report states: the machine, its load, and a results section of a shared
markdown page rewritten in place (between <!-- name:begin --> and <!-- name:end -->)."""

from __future__ import annotations

import os
import platform
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def machine_description() -> str:
    """The GPU if torch sees one, else the CPU model, with the core count."""
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name()}, {os.cpu_count()} CPU cores"
    except ImportError:
        pass
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        name = next(line.split(":", 1)[1].strip() for line in lines if "model name" in line)
    except (OSError, StopIteration):
        name = platform.processor() or "unknown CPU"
    return f"{name}, {os.cpu_count()} cores"


def load_average() -> str:
    """'load average 1.2, 3.4, 5.6' (1, 5, 15 minutes), like uptime's."""
    try:
        return "load average " + ", ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "load average unknown"


def write_section(path: Path, name: str, body: str, title: str = "# Benchmarks") -> None:
    """Replace (or append) the part of `path` between the markers of section `name`, so that
    each benchmark rewrites only its own section of a shared results page."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = path.read_text() if path.exists() else title + "\n"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def bootstrap_interval(
    items: Sequence[T],
    statistic: Callable[[list[T]], float | None],
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.90,
) -> tuple[float, float] | None:
    """The central `level` interval of `statistic` over bootstrap resamples of `items` (drawn
    with replacement, as many as there are; a resample whose statistic is None is skipped).
    Items are the independent units, e.g. whole prompts. None with fewer than two items."""
    if len(items) < 2:
        return None
    rng, values = random.Random(seed), []
    for _ in range(resamples):
        value = statistic(rng.choices(items, k=len(items)))
        if value is not None:
            values.append(value)
    if not values:
        return None
    values.sort()
    tail = (1.0 - level) / 2
    return values[int(tail * (len(values) - 1))], values[int((1.0 - tail) * (len(values) - 1))]
