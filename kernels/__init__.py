"""Attention backends behind kernels.attention.AttentionBackend, and sampling ops."""
