"""`kafscale-lakehouse segment inspect`: a second door to the decoder, from local paths and S3."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kafscale_lakehouse.apps.cli import main
from kafscale_lakehouse_tests.support.servers import ACCESS_KEY, REGION, S3_BUCKET, SECRET_KEY

FIXTURES = ["edge-cases", "pizzas-gzip", "pizzas-lz4", "pizzas-snappy", "pizzas-uncompressed", "pizzas-zstd",
            "worked-example"]


def _lay_out(fixture_dir: Path, root: Path) -> tuple[Path, dict]:
    """Copy a fixture's .kfs/.index under `root` at its `s3_key`, so topic/partition come from the path."""
    meta = json.loads((fixture_dir / "fixture.json").read_text())
    kfs = root / meta["s3_key"]
    kfs.parent.mkdir(parents=True, exist_ok=True)
    source = next(fixture_dir.glob("*.kfs"))
    shutil.copy(source, kfs)
    shutil.copy(source.with_suffix(".index"), kfs.with_suffix(".index"))
    return kfs, meta


def _expected(fixture_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (fixture_dir / "expected.jsonl").read_text().splitlines() if line]


def _record_lines(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("name", FIXTURES)
def test_records_match_golden_fixture(name, fixture_segments_dir, tmp_path, capsys):
    kfs, meta = _lay_out(fixture_segments_dir / name, tmp_path)
    assert main(["segment", "inspect", str(kfs), "--records"]) == 0
    out = capsys.readouterr().out
    assert _record_lines(out) == _expected(fixture_segments_dir / name)
    assert f"topic: {meta['topic']} partition: {meta['partition']}" in out
    assert f"last_offset={meta['last_offset']}" in out
    assert f"codec={meta['codec']}" in out
    assert "crc=MISMATCH" not in out and "index:" in out and "missing" not in out


def test_flat_file_needs_topic_and_partition_flags(fixture_segments_dir, capsys):
    kfs = next((fixture_segments_dir / "worked-example").glob("*.kfs"))
    assert main(["segment", "inspect", str(kfs)]) == 2
    assert "not a segment key" in capsys.readouterr().err
    assert main(["segment", "inspect", str(kfs), "--records", "--topic", "orders", "--partition", "0"]) == 0
    assert _record_lines(capsys.readouterr().out) == _expected(fixture_segments_dir / "worked-example")


def test_corrupt_batch_is_named_and_exit_code_is_nonzero(fixture_segments_dir, tmp_path, capsys):
    kfs, _ = _lay_out(fixture_segments_dir / "pizzas-uncompressed", tmp_path)
    data = bytearray(kfs.read_bytes())
    data[300] ^= 0x01  # inside the first batch's records
    kfs.write_bytes(bytes(data))
    assert main(["segment", "inspect", str(kfs)]) == 1
    captured = capsys.readouterr()
    batch_lines = [line for line in captured.out.splitlines() if line.strip().startswith("batch @")]
    assert [("crc=MISMATCH" in line) for line in batch_lines] == [True, False, False]
    assert str(kfs) in captured.err and "CRC-32C" in captured.err


def test_truncated_segment_is_a_clear_error(fixture_segments_dir, tmp_path, capsys):
    kfs, _ = _lay_out(fixture_segments_dir / "pizzas-gzip", tmp_path)
    kfs.write_bytes(kfs.read_bytes()[:-20])
    assert main(["segment", "inspect", str(kfs)]) == 2
    err = capsys.readouterr().err
    assert str(kfs) in err and "at byte" in err


def test_missing_index_is_reported(fixture_segments_dir, tmp_path, capsys):
    kfs, _ = _lay_out(fixture_segments_dir / "worked-example", tmp_path)
    kfs.with_suffix(".index").unlink()
    assert main(["segment", "inspect", str(kfs)]) == 0
    assert "missing (an orphan .kfs is never ingested)" in capsys.readouterr().out


def test_inspect_from_s3(seaweedfs, fixture_segments_dir, unique_prefix, monkeypatch, capsys):
    fixture = fixture_segments_dir / "pizzas-snappy"
    meta = json.loads((fixture / "fixture.json").read_text())
    key = f"{unique_prefix}/{meta['s3_key']}"
    s3 = seaweedfs.s3_client()
    source = next(fixture.glob("*.kfs"))
    s3.put_object(Bucket=S3_BUCKET, Key=key, Body=source.read_bytes())
    s3.put_object(Bucket=S3_BUCKET, Key=key[: -len(".kfs")] + ".index", Body=source.with_suffix(".index").read_bytes())
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweedfs.s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", REGION)
    assert main(["segment", "inspect", f"s3://{S3_BUCKET}/{key}", "--records"]) == 0
    assert _record_lines(capsys.readouterr().out) == _expected(fixture)

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    assert main(["segment", "inspect", f"s3://{S3_BUCKET}/{key}"]) == 2
    err = capsys.readouterr().err
    assert "rejected the credentials" in err and "wrong-secret" not in err
