"""Structured output: grammars compiled with llguidance, one matcher per request (grammar.py,
matcher.py); the sampler applies the matcher's token bitmask (engine/sample/sampler.py)."""
