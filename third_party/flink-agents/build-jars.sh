#!/usr/bin/env bash
# Builds Apache Flink Agents' two dist jars (0.3.1: flink-agents-dist-common, and flink-agents-dist-flink-2.3
# with classifier thin) from the Java source of its release-0.3.1 tag kept beside this script, and installs them
# into the flink_agents package of a Python environment (flink_agents/lib/common/, flink_agents/lib/flink-2.3/),
# where `AgentsExecutionEnvironment.get_execution_environment(env)` loads them.
#
#   third_party/flink-agents/build-jars.sh VENV/bin/python
#
# Needs Java 17 and Maven (Maven Central). The build is cached outside the repository, in $FLINK_AGENTS_CACHE
# (default ~/.cache/flink-memory/flink-agents-0.3.1): a second run only copies the jars. The release's pinned
# AWS SDK, Milvus and Fluss versions are not all served by Maven Central; newer patch releases are.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${1:?usage: build-jars.sh PYTHON (the interpreter of the environment that has flink-agents)}
version=0.3.1
cache=${FLINK_AGENTS_CACHE:-$HOME/.cache/flink-memory/flink-agents-$version}
src=$cache/src
common=$src/dist/common/target/flink-agents-dist-common-$version.jar
thin=$src/dist/flink-2.3/target/flink-agents-dist-flink-2.3-$version-thin.jar
sum=$(sha256sum "$here/flink-agents-$version-java-src.tar.gz" | cut -c1-16)

if [[ ! -f $common || ! -f $thin || ! -f $cache/.built-$sum ]]; then
  rm -rf "$src" && mkdir -p "$src"
  tar xzf "$here/flink-agents-$version-java-src.tar.gz" -C "$src"
  echo "[flink-agents] building the dist jars $version with Maven (a few minutes the first time)" >&2
  mvn -B -q -f "$src/pom.xml" package -pl dist/common,dist/flink-2.3 -am -DskipTests \
    -Drat.skip=true -Dspotless.skip=true -Dspotless.check.skip=true -Dcheckstyle.skip=true \
    -Daws.sdk.version=2.32.29 -Dmilvus.version=2.6.22 -Dfluss.version=0.9.1-incubating
  rm -f "$cache"/.built-* && touch "$cache/.built-$sum"
fi

lib=$("$python" -c 'import flink_agents, pathlib; print(pathlib.Path(flink_agents.__file__).parent / "lib")')
mkdir -p "$lib/common" "$lib/flink-2.3"
cp "$common" "$lib/common/"
cp "$thin" "$lib/flink-2.3/"
echo "[flink-agents] jars in $lib: $(cd "$lib" && ls common/*.jar flink-2.3/*.jar | tr '\n' ' ')" >&2
