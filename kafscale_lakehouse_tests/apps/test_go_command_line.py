"""The Go iceberg-processor's command line: its Helm chart starts the image with `-config=<path>` and nothing else, and
the processor polls until SIGTERM; `-config <path>` (Go's flag package takes both) works the same, in every command."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from kafscale_lakehouse.apps import cli
from kafscale_lakehouse_tests.engine.ingestion.harness import IngestWorld


@pytest.fixture
def world(tmp_path, unique_prefix) -> IngestWorld:
    return IngestWorld("embedded", tmp_path, unique_prefix, f"orders-{unique_prefix}")


@pytest.fixture
def restore_sigterm():
    """The CLI installs its SIGTERM handler in this process; pytest's is put back afterwards."""
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def test_the_charts_config_flag_alone_runs_the_ingest_loop_until_sigterm(world, spark, restore_sigterm):
    world.write_segments(0, 60, records_per_segment=30)
    config_path = world.write_config_file(poll_interval_seconds=1)

    returned = threading.Event()

    def stop_once_landed() -> None:
        """SIGTERM, as Kubernetes stops the pod, once every record landed (only to the CLI's own handler)."""
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not returned.is_set():
            try:
                if len(world.table_rows()) == 60:
                    break
            except Exception:  # the table does not exist before the first commit
                pass
            time.sleep(0.5)
        if not returned.is_set() and signal.getsignal(signal.SIGTERM) is cli._exit_on_sigterm:
            os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop_once_landed, daemon=True)
    stopper.start()
    try:
        with pytest.raises(SystemExit) as stopped:
            cli.main([f"-config={config_path}"])
    finally:
        returned.set()
        stopper.join()
    assert stopped.value.code == 128 + signal.SIGTERM
    world.assert_exactly_once(runs=1)


@pytest.mark.parametrize("flag", ["-config={}", "-config {}"])
def test_go_style_config_flag_is_accepted_by_commands(world, spark, restore_sigterm, flag):
    world.write_segments(0, 40, records_per_segment=20)
    config_path = world.write_config_file()
    assert cli.main(["ingest", *flag.format(config_path).split(" "), "--once"]) == 0
    world.assert_exactly_once(runs=1)


def test_config_flag_names_the_missing_file(tmp_path, capsys):
    missing = tmp_path / "config" / "config.yaml"
    assert cli.main([f"-config={missing}"]) == 2
    assert str(missing) in capsys.readouterr().err


def test_no_command_and_no_config_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as usage:
        cli.main([])
    assert usage.value.code == 2
    assert "-config FILE" in capsys.readouterr().err
