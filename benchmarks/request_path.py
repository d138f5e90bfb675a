"""One streamed chat request's path through the code, file by file: admission, one engine
step and the chunks out, as the calls that cross from one of the project's files into another.

A real server (server/app.py, in process through httpx's ASGI transport) and engine thread
serve one streamed /v1/chat/completions request with max_tokens=1 (admission, one step that
prefills and samples, the chunks out). Every Python call is traced (sys.setprofile on both
threads); a hop is a call whose callee is in a project file other than its caller's (the
nearest project frame). The model and the kernels are leaves: the hop into them counts,
their inner calls do not. Prints the hops in order and the counts: hops (each distinct
caller file -> callee function once; reading a property is data, not a hop), the file -> file
pairs they cross, and the files they touch.

    .venv/bin/python benchmarks/request_path.py [--model smollm2-135m-instruct] [--list]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import inspect
import sys
import threading
from pathlib import Path

import httpx

import engine
from engine.config import EngineConfig
from engine.front.async_engine import AsyncEngine
from server.app import build_app

ROOT = Path(engine.__file__).resolve().parents[1]  # the checkout whose engine runs
PROJECT = tuple(str(ROOT / d) + "/" for d in ("engine", "server", "kernels"))
LEAVES = tuple(str(ROOT / d) + "/" for d in ("engine/models", "kernels"))


class Tracer:
    def __init__(self) -> None:
        self.hops: list[tuple[str, str]] = []  # (caller file, callee file:function), in order
        self.lock = threading.Lock()
        self.active = False  # recording: only while the request is served

    def __call__(self, frame, event, arg) -> None:
        if event != "call" or not self.active:
            return
        callee = frame.f_code.co_filename
        if not callee.startswith(PROJECT):
            return
        caller = _project_caller(frame.f_back)
        if caller is None or caller == callee or caller.startswith(LEAVES):
            return
        if _is_property(frame):  # reading a field is data, not a hop
            return
        hop = (_short(caller), f"{_short(callee)}:{frame.f_code.co_qualname}")
        with self.lock:
            self.hops.append(hop)


def _is_property(frame) -> bool:
    owner = frame.f_locals.get("self")
    if owner is None:
        return False
    attribute = inspect.getattr_static(type(owner), frame.f_code.co_name, None)
    return isinstance(attribute, (property, functools.cached_property))


def _project_caller(frame) -> str | None:
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(PROJECT):
            return name
        frame = frame.f_back
    return None


def _short(path: str) -> str:
    return str(Path(path).relative_to(ROOT))


async def one_request(app, tracer: Tracer) -> str:
    body = {
        "model": None,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 1,
        "stream": True,
    }
    body = {k: v for k, v in body.items() if v is not None}
    transport = httpx.ASGITransport(app=app)
    sys.setprofile(tracer)
    threading.setprofile(tracer)  # the engine thread starts with the app's lifespan
    try:
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                tracer.active = True
                response = await client.post("/v1/chat/completions", json=body)
                tracer.active = False
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return response.text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--list", action="store_true", help="print every distinct hop")
    args = parser.parse_args()
    config = EngineConfig.from_flat(dict(model=args.model, threads=1, num_kv_blocks=64))
    engine = AsyncEngine.from_config(config)
    app = build_app(engine)
    tracer = Tracer()
    text = asyncio.run(one_request(app, tracer))
    assert text.rstrip().endswith("data: [DONE]"), text[-200:]
    distinct = list(dict.fromkeys(tracer.hops))
    files = {caller for caller, _ in distinct} | {c.split(":")[0] for _, c in distinct}
    pairs = dict.fromkeys((caller, callee.split(":")[0]) for caller, callee in distinct)
    if args.list:
        for caller, callee in distinct:
            print(f"{caller:40s} -> {callee}")
    print(
        f"hops: {len(distinct)} (distinct calls into another file; {len(tracer.hops)} in all), "
        f"{len(pairs)} file -> file pairs, {len(files)} files"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
