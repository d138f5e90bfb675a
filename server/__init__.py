"""OpenAI-compatible HTTP server on top of engine.AsyncEngine."""
