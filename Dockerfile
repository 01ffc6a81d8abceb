# syntax=docker/dockerfile:1.7
# User-code image of kafscale-lakehouse for the official Dagster Helm chart (helm-values/README.md). One image
# serves three roles: the code location's gRPC server, the run pods of the K8sRunLauncher (the chart and the
# launcher pass their command as container args, which replace CMD) and, in the large deployment, the Spark
# executor pods.
FROM python:3.11-slim-bookworm

# Java 17 for Spark, from Debian. The slim image drops /usr/share/man, where the JRE's postinst links its pages.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv

WORKDIR /opt/kafscale-lakehouse
COPY pyproject.toml README.md ./
COPY kafscale_lakehouse ./kafscale_lakehouse
# The `k8s` extra adds dagster-k8s and dagster-postgres (the chart's instance keeps runs and events in PostgreSQL, and
# run pods load that instance); `glue`, `hive` and `bigquery` every other catalog type pyiceberg ships. gcc builds
# the package's C extension (value_formats/_avro_columns.c, the columnar Avro decoder) and is removed in the same layer.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir ".[k8s,glue,hive,bigquery]" \
    && apt-get purge -y --auto-remove gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# Spark's Python workers must run this venv's interpreter; SPARK_HOME is pip's pyspark (its jars start executors).
# KAFSCALE_LAKEHOUSE_CONFIG is where the values mount the ConfigMap; DAGSTER_HOME is the chart's default.
ENV PYSPARK_PYTHON=/opt/venv/bin/python \
    SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark \
    KAFSCALE_LAKEHOUSE_CONFIG=/etc/kafscale-lakehouse/lakehouse.yaml \
    DAGSTER_HOME=/opt/dagster/dagster_home

COPY --chmod=0755 <<'EOF' /usr/local/bin/kafscale-lakehouse-entrypoint
#!/bin/bash
# Runs the container's command as given (`dagster api grpc …`, `dagster api execute_run …`,
# `kafscale-lakehouse …`), except `executor`: Spark on Kubernetes starts executor pods from this image with
# that single argument and describes the executor in SPARK_* variables. Spark's own images handle it in their
# entrypoint, which pip's pyspark does not ship, so this starts the executor JVM the same way. And the Go
# iceberg-processor's Helm chart, which runs its image with only `-config=<path>`: that is `kafscale-lakehouse -config=…`.
set -euo pipefail
if [[ "${1:-}" == -config* || "${1:-}" == --config* ]]; then
    exec kafscale-lakehouse "$@"
fi
if [[ "${1:-}" != "executor" ]]; then
    exec "$@"
fi
# Spark passes the executor's JVM options as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, …, in that (numeric) order.
java_options=()
while IFS= read -r name; do
    java_options+=("${!name}")
done < <(compgen -e | grep -E '^SPARK_JAVA_OPT_[0-9]+$' | sort -t_ -k4 -n)
classpath="${SPARK_HOME}/jars/*"
if [[ -n "${SPARK_CONF_DIR:-}" ]]; then
    classpath="${SPARK_CONF_DIR}:${classpath}"
fi
exec java "${java_options[@]}" \
    -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
    -cp "${classpath}" \
    org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
    --driver-url "${SPARK_DRIVER_URL}" \
    --executor-id "${SPARK_EXECUTOR_ID}" \
    --cores "${SPARK_EXECUTOR_CORES}" \
    --app-id "${SPARK_APPLICATION_ID}" \
    --hostname "${SPARK_EXECUTOR_POD_IP}" \
    --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID}" \
    --podName "${SPARK_EXECUTOR_POD_NAME}"
EOF

# A fixed numeric user, so pods can require runAsNonRoot; its home is the working directory Spark writes to.
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/lakehouse lakehouse \
    && mkdir -p "$DAGSTER_HOME" \
    && chown lakehouse:lakehouse "$DAGSTER_HOME"
USER 10001:10001
WORKDIR /home/lakehouse

ENTRYPOINT ["/usr/local/bin/kafscale-lakehouse-entrypoint"]
CMD ["dagster", "api", "grpc", "--module-name", "kafscale_lakehouse.definitions", "--host", "0.0.0.0", "--port", "3030"]
