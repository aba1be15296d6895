#!/usr/bin/env bash
# Fetches the real Kafka parts with Maven (the machine's own settings) into .cache/jvm/:
#   .cache/jvm/kafka-broker/   Apache Kafka's broker (KRaft, single node) and its runtime jars,
#                              plus the command-line tools (console producer and consumer)
#   .cache/jvm/spark-kafka/    Spark's Kafka connector for the installed pyspark, with the jars
#                              pyspark does not ship itself (kafka-clients, the token provider,
#                              commons-pool2); common/kafka_jars.py finds both folders.
# Idempotent: a folder with its .complete marker is kept. Called by setup.sh --test or --kafka.
#
# Spark's connector is taken at the installed pyspark's version, else the newest earlier patch
# release of the same minor line that resolves (Spark keeps the connector API stable within a
# minor line). Its token provider (spark-token-provider-kafka) is taken the same way on its own:
# Maven Central as mirrored here has spark-sql-kafka 4.1.2-4.1.3 but the token provider only up to
# 4.1.1, and 4.1.3 is the first 4.1.x connector with the fix of SPARK-55271/SPARK-57438 (a
# restarted query that replays a batch died in KafkaMicroBatchStream.metrics), so pyspark 4.1.4
# runs connector 4.1.3 with token provider 4.1.1. A cache fetched by an older recipe (its
# .complete marker holds another RECIPE) is fetched again.
# Spark's parent POM names a repository `gcs-maven-central-mirror`; the generated POMs give that
# id Central's address so resolution does not stop at a host that cannot be reached.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
KAFKA_VERSION=${ELASTIQ_KAFKA_VERSION:-3.9.1}
cache=${ELASTIQ_JVM_CACHE:-$PWD/.cache/jvm}

if ! command -v mvn >/dev/null 2>&1; then
  echo "setup: Maven (mvn) not found; the Kafka broker and Spark's Kafka connector are fetched" \
       "with it: install it (Debian: apt-get install maven) and run scripts/setup.sh --kafka again" >&2
  exit 2
fi

pom() {  # pom DEPENDENCY_XML... : a throwaway POM that depends on the given artifacts
  cat <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>elastiq.setup</groupId><artifactId>kafka-parts</artifactId><version>1</version>
  <packaging>pom</packaging>
  <repositories>
    <repository><id>gcs-maven-central-mirror</id><url>https://repo.maven.apache.org/maven2</url></repository>
  </repositories>
  <dependencies>$*</dependencies>
</project>
POM
}

dep() { echo "<dependency><groupId>$1</groupId><artifactId>$2</artifactId><version>$3</version></dependency>"; }
# dep_without GROUP ARTIFACT VERSION EXCLUDED_ARTIFACT: a dependency less one of its own (same group)
dep_without() {
  echo "<dependency><groupId>$1</groupId><artifactId>$2</artifactId><version>$3</version>" \
       "<exclusions><exclusion><groupId>$1</groupId><artifactId>$4</artifactId></exclusion></exclusions></dependency>"
}

resolves() {  # resolves GROUP:ARTIFACT:VERSION : whether Maven can fetch that jar (alone)
  mvn -q -B dependency:get -Dartifact="$1" -Dtransitive=false >/dev/null 2>&1
}

newest_patch() {  # newest_patch ARTIFACT MINOR PATCH : newest MINOR.p (p <= PATCH) of a Spark jar
  local p
  for p in $(seq "$3" -1 0); do
    if resolves "org.apache.spark:$1:$2.$p"; then echo "$2.$p"; return 0; fi
  done
  return 1
}

copy_deps() {  # copy_deps DEST INCLUDE_IDS DEPENDENCY_XML... : resolve and copy jars into DEST
  local dest=$1 include=$2; shift 2
  local work; work=$(mktemp -d)
  pom "$@" > "$work/pom.xml"
  local args=(-q -B -f "$work/pom.xml" dependency:copy-dependencies
              -DoutputDirectory="$dest.partial" -DincludeScope=runtime)
  [ -n "$include" ] && args+=(-DincludeArtifactIds="$include")
  rm -rf "$dest.partial"
  if mvn "${args[@]}" > "$work/mvn.log" 2>&1; then
    rm -rf "$dest" && mv "$dest.partial" "$dest" && touch "$dest/.complete"
    rm -rf "$work"; return 0
  fi
  grep -m1 ERROR "$work/mvn.log" | sed 's/^.*ERROR[^A-Za-z]*/setup: maven: /' | cut -c1-240 >&2 || true
  rm -rf "$work" "$dest.partial"; return 1
}

broker_dir=$cache/kafka-broker
if [ ! -f "$broker_dir/.complete" ]; then
  echo "setup: fetching Apache Kafka $KAFKA_VERSION (broker and tools) with Maven" >&2
  mkdir -p "$cache"
  copy_deps "$broker_dir" "" \
    "$(dep org.apache.kafka kafka_2.13 "$KAFKA_VERSION")" \
    "$(dep org.apache.kafka kafka-tools "$KAFKA_VERSION")" \
    "$(dep org.slf4j slf4j-reload4j 1.7.36)" \
    || { echo "setup: could not fetch Apache Kafka $KAFKA_VERSION with Maven" >&2; exit 1; }
  echo "$KAFKA_VERSION" > "$broker_dir/VERSION"
fi

connector_dir=$cache/spark-kafka
RECIPE=2  # 2: connector and token provider each at their newest resolving patch release
if [ "$(cat "$connector_dir/.complete" 2>/dev/null)" != "$RECIPE" ]; then
  spark=$("$PY" -c 'import pyspark; print(pyspark.__version__)')
  minor=${spark%.*}; patch=${spark##*.}
  sql=spark-sql-kafka-0-10_2.13; token=spark-token-provider-kafka-0-10_2.13
  echo "setup: finding Spark's Kafka connector $minor.x (pyspark $spark) with Maven" >&2
  v=$(newest_patch "$sql" "$minor" "$patch") \
    || { echo "setup: no $sql $minor.x (<= $spark) could be fetched with Maven" >&2; exit 1; }
  t=$(newest_patch "$token" "$minor" "${v##*.}") \
    || { echo "setup: no $token $minor.x (<= $v) could be fetched with Maven" >&2; exit 1; }
  echo "setup: fetching Spark's Kafka connector $v (token provider $t) with Maven" >&2
  copy_deps "$connector_dir" "$sql,$token,kafka-clients,commons-pool2" \
      "$(dep_without org.apache.spark "$sql" "$v" "$token")" \
      "$(dep org.apache.spark "$token" "$t")" \
    || { echo "setup: could not fetch Spark's Kafka connector $v with Maven" >&2; exit 1; }
  echo "$v" > "$connector_dir/VERSION"; echo "$t" > "$connector_dir/TOKEN_PROVIDER_VERSION"
  echo "$RECIPE" > "$connector_dir/.complete"
fi
echo "setup: Kafka parts in $cache (broker $(cat "$broker_dir/VERSION"), connector $(cat "$connector_dir/VERSION"))" >&2
