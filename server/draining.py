"""DrainingServer: uvicorn's server with a draining SIGTERM (server/cli.py's docstring): new
requests get 503 (and /health turns 503) while in-flight requests finish, for at most the drain
timeout; what is still running then is aborted, and the process exits 0. A second SIGTERM, or
Ctrl-C, stops at once (uvicorn's usual behaviour)."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from types import FrameType

import uvicorn

from server.serving import ServingContext

logger = logging.getLogger("goodspeed.server")


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM drains instead of closing the listener at once."""

    def __init__(self, config: uvicorn.Config, ctx: ServingContext, drain_timeout: float) -> None:
        super().__init__(config)
        self.ctx = ctx
        self.drain_timeout = drain_timeout
        self._drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self._drain_task is not None or not self.started:
            super().handle_exit(sig, frame)
            return
        # Signal handlers run on the main thread, which is the one running uvicorn's loop.
        # SIGTERM is deliberately not recorded in uvicorn's captured signals: uvicorn would
        # re-raise it after shutdown and the process would die of it instead of exiting 0.
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        """Refuse new and queued requests; let the running ones finish, their last bytes
        written, until the drain timeout; abort what is left then."""
        self.ctx.start_draining()
        engine = self.ctx.engine
        deadline = time.monotonic() + self.drain_timeout
        logger.info(
            "SIGTERM: draining %d in-flight sequences (at most %.0f s)",
            engine.num_in_flight,
            self.drain_timeout,
        )
        if not await engine.wait_until_idle(self.drain_timeout):
            logger.warning("drain timeout: aborting %d sequences", engine.num_in_flight)
            engine.abort_all("the server is shutting down (drain timeout)")
        else:  # the engine is done: let the responses reach their sockets ([DONE] included)
            while self.server_state.tasks and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        self.should_exit = True
