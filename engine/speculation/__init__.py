"""Speculative decoding: proposers, draft trees, lossless verification, goodput control."""
