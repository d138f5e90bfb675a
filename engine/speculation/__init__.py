"""Speculative decoding: the driver (the engine's one entry: plan, propose, observe), proposers
(proposers/) and control (control/); build.py puts them together. Verification belongs to the
runner's sampler (engine/sample); drafts and results cross as contracts (engine/outputs.py)."""
