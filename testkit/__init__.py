"""Helpers the tests and the benchmarks share: the embedded stack, bounded waits, oracles.

Owns `e2e_support` (the running stack of embedded master, agents, scheduler and API, process
lookups, plain-Python oracles), `waiting` (the one bounded poll) and `control_reader` (the
control query and the channel reader that follows its moved sink). Neither tests/ nor
benchmarks/ import each other's helpers: both import these. Not installed with the product.
"""
