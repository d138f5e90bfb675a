"""ServerSettings: the HTTP server's own policy (names, CORS, authentication, limits,
timeouts), frozen and checked at construction. Its own module, free of the web stack, so the
command line can read its defaults before the server's imports (server/cli.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerSettings:
    # Names clients may use for the model; the first is the one responses report.
    # Empty: the engine's model name.
    served_model_names: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()  # CORS: browser origins allowed; empty: CORS off
    api_key: str | None = None  # None: no authentication
    max_body_bytes: int = 4 * 2**20  # larger request bodies get 413
    header_timeout_s: float = 10.0  # a request head slower than this: connection closed
    body_timeout_s: float = 30.0  # a request body slower than this: 408
    # A request not scheduled within this many seconds of arrival gets 503 (None: no limit).
    admission_timeout_s: float | None = 30.0
    retry_after_s: int = 1  # Retry-After of 503 answers
    disconnect_poll_s: float = 0.25  # how often a non-streaming request checks for its client
    # One request's share of the engine: prompts x n sequences, and the tokens they may reach
    # (prompt + max_tokens, or the context length without max_tokens, summed over them).
    max_seqs_per_request: int = 256
    max_tokens_per_request: int = 2**18

    def __post_init__(self) -> None:
        if any(not name for name in self.served_model_names):
            raise ValueError("served model names must not be empty")
        for name in ("max_seqs_per_request", "max_tokens_per_request", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout_s", "body_timeout_s", "admission_timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value}")
