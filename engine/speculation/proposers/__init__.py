"""Proposers: n-gram, Token Recycling and a draft model behind one Protocol, and the
ProposerSet that routes each request to the one the policy chose."""
