"""Simulated wide-area links for tests and benchmarks: a userspace link proxy (delay, jitter, loss)
and regions made of Linux network namespaces (`regions.Region`)."""
