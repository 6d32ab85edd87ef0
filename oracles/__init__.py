"""The slow checking implementations, kept in the repository and out of the installed package: each
computes what a method must output plainly (no KV cache, a full forward pass for every distribution),
so that the tests can hold the fast engine and baselines to it."""
