"""Elastiq: an elastic stream query service.

This package owns the command line (`elastiq.cli`) and the embedded Mesos-compatible cluster
(`embedded_mesos`). The compiler, scheduler and executor live in their own top-level packages;
what they share (source positions and diagnostics among it) is `common`.
"""

__version__ = "0.1.0"
