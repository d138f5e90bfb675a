"""Speculation control: how many drafts each request gets (off, fixed:K, goodput), from
acceptance estimates, a step-time cost model seeded by a start-up profile, and a search."""
