"""The import structure docs/architecture.md draws ("Rooms"): no import cycles; no import from
a lower room of engine/ into a higher one, nor between rooms on the same floor; speculation
speaks to the runner only through contracts; kernels never import the engine and the engine
never imports the server.

Imports are read with `ast`, TYPE_CHECKING ones included (a type names a dependency too), and
lazy ones inside functions too; nothing is imported.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# engine/'s floors, from the top: a file may import its own room and the floors below. Rooms
# on one floor never import each other.
FLOORS = [
    ["engine/__init__.py"],
    ["engine/front/"],
    ["engine/llm_engine.py"],
    ["engine/speculation/", "engine/runner/"],
    ["engine/sample/", "engine/core/", "engine/output/"],
    ["engine/outputs.py"],
    ["engine/request.py"],
    ["engine/structured/", "engine/arg_utils.py"],
    ["engine/models/", "engine/config.py", "engine/sampling_params.py"],
]
# speculation/'s own floors: the factories, the driver, what it keeps beside it (the shadow
# checks, the tally), control, the proposers.
SPECULATION = [
    ["engine/speculation/__init__.py", "engine/speculation/build.py"],
    ["engine/speculation/driver.py"],
    ["engine/speculation/shadow.py", "engine/speculation/tally.py"],
    ["engine/speculation/control/"],
    ["engine/speculation/proposers/"],
]


@functools.cache
def source_files(*folders: str) -> dict[str, Path]:
    """module name -> file, for every Python file under the folders."""
    files = {}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def import_graph(*folders: str) -> dict[str, set[str]]:
    """module -> the project modules it imports (`from a import b` names module a.b if any)."""
    files = source_files("engine", "kernels", "server")
    graph = {}
    for module, path in source_files(*folders).items():
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[module] = {name for name in names if name in files and name != module}
    return graph


def place(module: str, floors: list[list[str]]) -> tuple[int, str] | None:
    """(floor, room) of a module, None when no room of `floors` holds it."""
    path = source_files("engine", "kernels", "server")[module].relative_to(ROOT).as_posix()
    for level, rooms in enumerate(floors):
        for room in rooms:
            if path == room or (room.endswith("/") and path.startswith(room)):
                return level, room
    return None


def crossings(floors: list[list[str]]) -> list[str]:
    """Imports that reach up a floor, or across to another room on the same floor."""
    bad = []
    graph = import_graph("engine")
    for module, imported in graph.items():
        here = place(module, floors)
        for name in imported:
            there = place(name, floors)
            if here is None or there is None or there[1] == here[1]:
                continue
            if there[0] <= here[0]:
                bad.append(f"{module} -> {name}")
    return bad


def test_every_engine_file_has_a_room():
    homeless = [m for m in import_graph("engine") if place(m, FLOORS) is None]
    assert not homeless, f"add these to FLOORS: {homeless}"


def test_no_import_cycles():
    graph = import_graph("engine", "kernels", "server")
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for name in sorted(graph[module]):
            if state.get(name) == 1:
                cycles.append(path[path.index(name) :] + [name])
            elif name not in state:
                visit(name, [*path, name])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_engine_rooms_import_only_downwards():
    assert not crossings(FLOORS)


def test_speculation_rooms_import_only_downwards():
    assert not crossings(SPECULATION)


def test_every_speculation_file_has_a_room():
    homeless = [m for m in import_graph("engine/speculation") if place(m, SPECULATION) is None]
    assert not homeless, f"add these to SPECULATION: {homeless}"


def test_speculation_speaks_to_the_runner_only_through_contracts():
    graph = import_graph("engine/speculation")
    reaching = {
        (m, n) for m, names in graph.items() for n in names if n.startswith("engine.runner")
    }
    assert not reaching


def test_kernels_never_import_the_engine_and_the_engine_never_the_server():
    kernels = import_graph("kernels")
    engine = import_graph("engine")
    assert not {(m, n) for m, names in kernels.items() for n in names if n.startswith("engine")}
    assert not {(m, n) for m, names in engine.items() for n in names if n.startswith("server")}
