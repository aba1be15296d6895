"""Helpers the tests and the benchmarks share: the embedded stack, bounded waits, oracles.

Owns `e2e_support` (the running stack of embedded master, agents, scheduler and API, process
lookups, plain-Python oracles), `patterns_support` and `elastic_support` (what the pattern and
rescaling tests on the embedded cluster share), `waiting` (the one bounded poll) and
`control_reader` (the control query and the channel reader that follows its moved sink).
Neither tests/ nor benchmarks/ import each other's helpers: both import these. Not installed
with the product.
"""
