"""The front: what callers talk to. LLM (offline, engine/front/llm.py) steps the engine in the
caller's thread; AsyncEngine (asyncio) runs it on one engine thread (engine_worker.py) and
hands each request's outputs to its RequestStream."""
