"""`python -m executor`: the Elastiq Mesos executor process an agent starts.

Owns the process entry: logging to stderr, refusing to run without the MESOS_* environment an
agent provides (exit 2 with a clear message), reading the settings (ELASTIQ_STATE_DIR,
ELASTIQ_SPARK_CORES) and the exit code (0 after a clean shutdown, 1 on an error, 2 on bad
settings). Does not own anything the executor does (`executor.mesos_executor`).
"""

from __future__ import annotations

import logging
import os
import sys

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
NOT_BY_HAND = "this is a Mesos executor; it is started by an agent, not by hand"
REQUIRED_ENV = ("MESOS_AGENT_ENDPOINT", "MESOS_FRAMEWORK_ID", "MESOS_EXECUTOR_ID")


def _configure_logging() -> None:
    logging.basicConfig(stream=sys.stderr, level=os.environ.get("ELASTIQ_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s %(threadName)s: %(message)s")
    for noisy in ("py4j", "pymesos"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def main(env: dict[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    missing = [name for name in REQUIRED_ENV if not env.get(name)]
    if missing:
        print(f"elastiq executor: {NOT_BY_HAND} (missing {', '.join(missing)})", file=sys.stderr)
        return EXIT_USAGE
    _configure_logging()
    from executor.mesos_executor import config_from_env, run_executor  # imports pymesos, Spark

    try:
        config = config_from_env(env)
    except ValueError as exc:
        print(f"elastiq executor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return run_executor(config)
    except Exception:
        logging.getLogger("executor").exception("executor %s: failed",
                                                env.get("MESOS_EXECUTOR_ID"))
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
