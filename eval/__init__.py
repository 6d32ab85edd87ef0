"""Benchmarks: data, prompts, answer extraction and metrics."""
