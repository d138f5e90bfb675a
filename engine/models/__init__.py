"""Model implementations and loaders (tensors start here)."""
