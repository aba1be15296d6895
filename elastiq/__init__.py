"""Elastiq: an elastic stream query service.

This package owns what every other part shares: the command line (`elastiq.cli`), source
positions and diagnostics (`elastiq.diagnostics`), and the embedded Mesos-compatible cluster
(`elastiq.embedded`). The compiler, scheduler and executor live in their own top-level packages.
"""

__version__ = "0.1.0"
