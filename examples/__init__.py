"""Example models and the script that trains them (used by `make demo`, the tests and benchmarks)."""
