"""Benchmarks and the cost model behind ``hvdtrain bench``; imported only by the command."""
