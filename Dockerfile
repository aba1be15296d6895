# Elastiq: the scheduler service and the `elastiq` CLI (Python 3.11, Java 17 for Spark 4.1).
#   docker build -t elastiq:0.1.0 .
#   docker run --rm elastiq:0.1.0 validate /opt/elastiq/examples/paper-filter.xml
# Elastiq is installed by scripts/setup.sh, which builds pymesos's http-parser for Python 3.11.
# Debian 13 (trixie): Debian 12 left regular security support in June 2026. Trixie ships no Java
# 17, so the JRE is Temurin's, the same one the agents run (deploy/agent/Dockerfile).
FROM eclipse-temurin:17-jre-jammy AS java

FROM python:3.11-slim-trixie

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    JAVA_HOME=/opt/java/openjdk \
    VIRTUAL_ENV=/opt/elastiq/venv \
    ELASTIQ_CLASS_ARCHIVE_DIR=/opt/elastiq/class-archive \
    PATH=/opt/elastiq/venv/bin:/opt/java/openjdk/bin:$PATH
COPY --from=java /opt/java/openjdk /opt/java/openjdk

# Java 17 for Spark (above); procps because Spark's launcher scripts call ps; tini reaps the
# executors' and Spark's children and forwards SIGTERM so the scheduler stops with failover.
RUN apt-get update \
 && apt-get install -y --no-install-recommends procps tini \
 && rm -rf /var/lib/apt/lists/*

# The same path as on the agents (deploy/agent/Dockerfile): the scheduler starts executors
# with its own interpreter's path, so it must exist there too.
WORKDIR /opt/elastiq
COPY pyproject.toml README.md requirements.lock ./
COPY scripts/ scripts/
COPY common/ common/
COPY compiler/ compiler/
COPY executor/ executor/
COPY scheduler/ scheduler/
COPY rewrite_rules/ rewrite_rules/
COPY elastiq/ elastiq/
COPY embedded_mesos/ embedded_mesos/
COPY examples/ examples/

# A C compiler only for building http-parser; removed in the same layer.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && python -m venv "$VIRTUAL_ENV" \
 && PYTHON="$VIRTUAL_ENV/bin/python" scripts/setup.sh --no-test-extras --locked \
 && apt-get purge -y build-essential && apt-get autoremove -y \
 && rm -rf /var/lib/apt/lists/* /root/.cache

RUN useradd --uid 10001 --create-home --home-dir /home/elastiq --shell /usr/sbin/nologin elastiq \
 && mkdir -p /var/lib/elastiq \
 && chown elastiq:elastiq /var/lib/elastiq
USER elastiq
WORKDIR /var/lib/elastiq

EXPOSE 8088
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8088/healthz', timeout=4).status != 200)"]
ENTRYPOINT ["/usr/bin/tini", "--", "elastiq"]
CMD ["--help"]
