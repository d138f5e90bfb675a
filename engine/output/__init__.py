"""Outputs: a step's changed requests become RequestOutputs (text deltas through incremental
detokenization, stop strings, logprobs, timings)."""
