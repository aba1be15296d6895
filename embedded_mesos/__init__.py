"""The embedded Mesos-compatible cluster: a master and agents serving the Mesos v1 HTTP
scheduler and executor APIs on one machine, so unmodified pymesos drivers run against it.

Owns nothing itself; re-exports the public pieces. A single-machine convenience like Spark's
local mode, never the path to scale (that is a real Mesos cluster).
"""

from embedded_mesos.agent import EmbeddedAgent
from embedded_mesos.auth import FrameworkCredential
from embedded_mesos.cluster import AgentProcess, EmbeddedCluster
from embedded_mesos.master import EmbeddedMaster

__all__ = ["AgentProcess", "EmbeddedAgent", "EmbeddedCluster", "EmbeddedMaster",
           "FrameworkCredential"]
