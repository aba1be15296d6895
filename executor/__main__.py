"""`python -m executor`: the Elastiq Mesos executor process an agent starts.

Owns the process entry: logging to stderr, refusing to run without the MESOS_* environment an
agent provides (exit 2 with a clear message), reading the settings (ELASTIQ_STATE_DIR,
ELASTIQ_SPARK_CORES) and the exit code (0 after a clean shutdown, 1 on an error, 2 on bad
settings), and raising its open-files limit to the hard limit before Spark starts (each task
query holds ~20 descriptors in the JVM, so a soft limit of 1024 would stop a machine at ~45
tasks). Does not own anything the executor does (`executor.mesos_executor`).
"""

from __future__ import annotations

import logging
import os
import resource
import sys

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
NOT_BY_HAND = "this is a Mesos executor; it is started by an agent, not by hand"
REQUIRED_ENV = ("MESOS_AGENT_ENDPOINT", "MESOS_FRAMEWORK_ID", "MESOS_EXECUTOR_ID")


def _configure_logging() -> None:
    logging.basicConfig(stream=sys.stderr, level=os.environ.get("ELASTIQ_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s %(threadName)s: %(message)s")
    for noisy in ("py4j", "pymesos"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def open_files_target(soft: int, hard: int) -> int:
    """The soft open-files limit to ask for: the hard limit, or 1 Mi when that is unlimited
    (Linux refuses an infinite RLIMIT_NOFILE), never below the current soft limit."""
    if hard == resource.RLIM_INFINITY:
        return soft if soft == resource.RLIM_INFINITY else max(soft, 1 << 20)
    return max(soft, hard) if soft != resource.RLIM_INFINITY else soft


def _raise_open_files_limit() -> None:
    """Lift the soft RLIMIT_NOFILE to what the hard limit allows; the JVM and its Python
    workers inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = open_files_target(soft, hard)
    if target != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            logging.getLogger("executor").warning("open-files limit stays %s: %s", soft, exc)
            return
    logging.getLogger("executor").info("open-files limit %s (hard %s)", target, hard)


def main(env: dict[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    missing = [name for name in REQUIRED_ENV if not env.get(name)]
    if missing:
        print(f"elastiq executor: {NOT_BY_HAND} (missing {', '.join(missing)})", file=sys.stderr)
        return EXIT_USAGE
    _configure_logging()
    _raise_open_files_limit()
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
