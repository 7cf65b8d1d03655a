"""Benchmarks of the deployment on the simulated Spark nodes (run with scripts/bench, not by pytest)."""
