"""Core scheduling and memory: the scheduler (one rule for prefill, decode, speculation slots
and preemption), the paged KV cache's block manager and its prefix cache. Pure Python."""
