#!/usr/bin/env bash
# `make demo`: the schema registry of the Avro mapping, a first round of the demo producer, then the Spark engine, the
# demo producer and `dagster dev`, stopped in an order in which no run fails for it.
# Ctrl-C or SIGTERM stops `dagster dev` (webserver, daemon, code servers) while the runs in flight finish; runs still
# going after a few seconds are canceled (Dagster records them canceled, not failed) and unwind; only when the last
# process `dagster dev` started is gone do the producer, the registry (which those runs read) and the engine, which
# those runs were using, stop.
# usage: DAGSTER_HOME=… scripts/run-demo.sh VENV_BIN ENGINE_PORT DAGSTER_PORT
set -uo pipefail
bin=$1 engine_port=$2 dagster_port=$3
RUN_FINISH_SECONDS=10  # a demo run takes a few seconds on a warm engine
DEV_STOP_TIMEOUT_SECONDS=60
REGISTRY_PORT=18081  # lakehouse.yaml's mappings[].schema_registry.url
REGISTRY_START_SECONDS=10
repo=$(cd "$(dirname "$0")/.." && pwd)

# Job control on: each background command gets a process group of its own, with SIGINT at its default (without it,
# bash starts them ignoring SIGINT, and `dagster dev` maps SIGTERM to that too, so nothing could stop it). Ctrl-C
# (SIGINT to the terminal's process group) or a SIGTERM to make's group reaches this script only, which stops the
# others in order.
set -m
# The Avro mapping's registry: the in-memory Confluent-compatible test registry, run from the repository (the test
# support is not in the wheel). Ids are deterministic, so a restarted registry gives the demo's schema its id again.
# A registry already listening on the port (another one of the user's) is used as it is.
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$bin/python" -m kafscale_lakehouse_tests.support.schema_registry \
  --port "$REGISTRY_PORT" & registry=$!
trap 'kill "$registry" 2>/dev/null; exit 130' INT  # until the others run (then `stop`, below)
trap 'kill "$registry" 2>/dev/null; exit 143' TERM
registry_listening() { (exec 3<>"/dev/tcp/127.0.0.1/$REGISTRY_PORT") 2>/dev/null; }
deadline=$((SECONDS + REGISTRY_START_SECONDS))
until registry_listening; do
  if ((SECONDS >= deadline)); then
    echo "run-demo: no schema registry listening on 127.0.0.1:$REGISTRY_PORT after ${REGISTRY_START_SECONDS} s" >&2
    kill "$registry" 2>/dev/null
    exit 1
  fi
  sleep 0.2
done
# Segments before the first sensor tick.
if ! "$bin/kafscale-lakehouse" demo-producer --lfs --avro --cdc --rounds 1; then
  kill "$registry" 2>/dev/null
  exit 1
fi
"$bin/kafscale-lakehouse" spark-engine --address "127.0.0.1:$engine_port" & engine=$!
"$bin/kafscale-lakehouse" demo-producer --lfs --avro --cdc & producer=$!
# `dagster dev` with SIGINT at its default even when this script was started with it ignored (nohup, a script's `&`,
# some CI runners: an ignored signal cannot be trapped or reset by bash, and `dagster dev` maps SIGTERM to its SIGINT
# handler, so it would ignore both and only the SIGKILL after DEV_STOP_TIMEOUT_SECONDS would stop it).
# The webserver's address lets a topic_pattern mapping's sensor ask it to reload the code location for a new topic.
KAFSCALE_LAKEHOUSE_WEBSERVER_URL="http://127.0.0.1:$dagster_port" SPARK_REMOTE="sc://127.0.0.1:$engine_port" "$bin/python" -c '
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execv(sys.argv[1], sys.argv[1:])' "$bin/dagster" dev -h 127.0.0.1 -p "$dagster_port" & dev=$!

# Started when stopping begins, as importing Dagster takes seconds: scripts/cancel_demo_runs.py reads one line;
# `cancel` cancels the runs in flight (those executing through canceling, so Dagster records them canceled, not
# failed) and the queued ones; anything else (end of input) leaves the runs alone.
start_canceller() {
  exec {canceller}> >("$bin/python" "$(dirname "$0")/cancel_demo_runs.py")
  canceller_pid=$!
}

# Run workers: started by a code server (Dagster's launcher: multiprocessing's spawn) or, with the opt-in forking
# launcher in DAGSTER_HOME's dagster.yaml, forked by it (orchestration/forking_launcher.py: the forker's command line,
# which its children keep; the forker exits with the daemon). Not the launcher's module name: a code server's command
# line holds it (the instance ref).
runs_in_flight() { pgrep -g "$dev" -f "multiprocessing.spawn|import serve_forks" >/dev/null; }
dev_running() { kill -0 -"$dev" 2>/dev/null; }

wait_while() {  # SECONDS COMMAND: until COMMAND fails or SECONDS passed; fails if COMMAND still succeeds
  local deadline=$((SECONDS + $1))
  while "$2" && ((SECONDS < deadline)); do sleep 0.2; done
  ! "$2"
}

stop() {
  trap '' INT TERM  # a second Ctrl-C does not cut the shutdown short
  if dev_running; then
    # `dagster dev` alone first: it stops the webserver and the daemon (no new runs) while the runs in flight finish.
    kill -INT "$dev" 2>/dev/null
    start_canceller
    if ! wait_while "$RUN_FINISH_SECONDS" runs_in_flight; then
      # Still going: canceled (marked first), then interrupted.
      echo cancel >&"$canceller"
      exec {canceller}>&-
      wait "$canceller_pid" || echo "run-demo: could not mark the runs in flight as canceling" >&2
      kill -INT -"$dev" 2>/dev/null
    else
      exec {canceller}>&-
    fi
    kill -TERM -"$dev" 2>/dev/null  # the code servers (the runs' multiprocessing resource tracker follows them)
    if ! wait_while "$DEV_STOP_TIMEOUT_SECONDS" dev_running; then
      echo "run-demo: dagster dev still running after ${DEV_STOP_TIMEOUT_SECONDS} s, killing it" >&2
      kill -KILL -"$dev" 2>/dev/null
    fi
  fi
  # The producer and the Avro mapping's schema registry after the runs: a run in flight still reads the registry.
  kill "$producer" 2>/dev/null
  wait "$producer" 2>/dev/null
  kill "$registry" 2>/dev/null
  wait "$registry" 2>/dev/null
  kill "$engine" 2>/dev/null
  wait "$engine" 2>/dev/null
}

trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
wait "$dev"
status=$?
stop
exit "$status"
