"""LFS envelopes (pure): Go's IsLfsEnvelope detection over Arrow columns, DecodeEnvelope, EnvelopeChecksum rules."""

from __future__ import annotations

import hashlib
import json
import zlib

import pyarrow as pa
import pytest

from kafscale_lakehouse.format.lfs import (
    ChecksumVerifier,
    LfsChecksumError,
    LfsEnvelopeError,
    encode_envelope,
    envelope_checksum,
    is_lfs_envelope,
    lfs_envelope_mask,
    parse_envelope,
)

BLOB = b"\x89PNG fake image bytes" * 100


def envelope(**fields) -> bytes:
    document = {"kfs_lfs": 1, "bucket": "b", "key": "k", "size": len(BLOB), "sha256": hashlib.sha256(BLOB).hexdigest()}
    document.update(fields)
    return json.dumps({k: v for k, v in document.items() if v is not ...}, separators=(",", ":")).encode()


@pytest.mark.parametrize(("value", "expected"), [
    (None, False),
    (b"", False),
    (b'{"kfs_lfs":1}', False),  # 13 bytes: under Go's 15-byte minimum
    (b'{"kfs_lfs":1,"b"}', True),  # detection only looks, it does not parse
    (b' {"kfs_lfs":1,"bucket":"b"}', False),  # must start with "{"
    (b'{"order_id": "o-1", "store_id": 3}', False),
    (b'{' + b' ' * 40 + b'"kfs_lfs":1}', True),  # marker ends at byte 50
    (b'{' + b' ' * 41 + b'"kfs_lfs":1}', False),  # marker crosses byte 50
    (b"\x00\xff" * 100, False),
])
def test_detection_matches_go_is_lfs_envelope_for_arrow_columns_and_single_values(value, expected):
    for array_type in (pa.binary(), pa.large_binary()):
        mask = lfs_envelope_mask(pa.array([value, b"plain"], array_type))
        assert mask.to_pylist() == [expected, False]
    assert is_lfs_envelope(value) is expected


def test_parse_reads_every_field_and_ignores_unknown_keys():
    parsed = parse_envelope(envelope(content_type="image/png", checksum_alg="md5", checksum="ab", proxy_id="p",
                                     original_headers={"h": "v"}, extra={"ignored": True}))
    assert (parsed.bucket, parsed.key, parsed.size, parsed.content_type, parsed.checksum_alg) == \
        ("b", "k", len(BLOB), "image/png", "md5")
    assert parsed.original_headers == (("h", "v"),) and parsed.location == "s3://b/k"


@pytest.mark.parametrize(("value", "problem"), [
    (b'{"kfs_lfs":1,"bucket":', "not JSON"),
    (b'["kfs_lfs", 1, 2, 3, 4, 5]', "not a JSON object"),
    (envelope(kfs_lfs=0), "missing required fields kfs_lfs"),
    (envelope(bucket=""), "missing required fields bucket"),
    (envelope(key=...), "missing required fields key"),
    (envelope(sha256=None), "missing required fields sha256"),
    (envelope(size="12"), "size is \"12\", expected an integer"),
    (envelope(size=1.5), "size is 1.5, expected an integer"),
    (envelope(kfs_lfs=True), "expected an integer"),
    (envelope(original_headers={"h": 1}), "original_headers values must be strings"),
])
def test_invalid_envelopes_are_errors_that_say_why(value, problem):
    with pytest.raises(LfsEnvelopeError, match="invalid LFS envelope") as caught:
        parse_envelope(value)
    assert problem in str(caught.value)


def test_keys_match_ignoring_case_like_encoding_json():
    parsed = parse_envelope(b'{"KFS_LFS":1,"Bucket":"b","KEY":"k","Sha256":"00","size":3}')
    assert (parsed.version, parsed.bucket, parsed.key, parsed.sha256) == (1, "b", "k", "00")


def test_checksum_rules_of_go_envelope_checksum():
    sha = hashlib.sha256(BLOB).hexdigest()
    md5 = hashlib.md5(BLOB).hexdigest()
    crc = zlib.crc32(BLOB).to_bytes(4, "big").hex()
    assert envelope_checksum(parse_envelope(envelope())) == ("sha256", sha)
    assert envelope_checksum(parse_envelope(envelope(checksum_alg="MD5", checksum=md5))) == ("md5", md5)
    assert envelope_checksum(parse_envelope(envelope(checksum_alg="crc32", checksum=crc))) == ("crc32", crc)
    # md5/crc32 without checksum: Go falls back to checking the sha256 field with sha256.
    assert envelope_checksum(parse_envelope(envelope(checksum_alg="crc32"))) == ("sha256", sha)
    assert envelope_checksum(parse_envelope(envelope(checksum_alg="none", checksum="x"))) == ("none", None)
    with pytest.raises(LfsEnvelopeError, match="unsupported checksum_alg 'sha1'"):
        envelope_checksum(parse_envelope(envelope(checksum_alg="sha1")))


@pytest.mark.parametrize("algorithm", ["sha256", "md5", "crc32", "none"])
def test_verifier_streams_chunks_and_detects_a_changed_byte(algorithm):
    parsed = parse_envelope(encode_envelope("b", "k", BLOB, checksum_alg=algorithm))
    verifier = ChecksumVerifier(parsed)
    for start in range(0, len(BLOB), 7):
        verifier.update(BLOB[start:start + 7])
    verifier.verify()
    changed = ChecksumVerifier(parsed)
    changed.update(BLOB[:-1] + b"!")
    if algorithm == "none":
        changed.verify()  # nothing is checked
    else:
        with pytest.raises(LfsChecksumError, match=f"{algorithm} checksum mismatch"):
            changed.verify()
    disabled = ChecksumVerifier(parsed, enabled=False)
    disabled.update(b"anything")
    disabled.verify()


def test_crc32_is_ieee_big_endian_hex_like_go():
    # Go: fmt.Sprintf("%x", crc32.ChecksumIEEE([]byte("hello"))) == "3610a686"
    parsed = parse_envelope(encode_envelope("b", "k", b"hello", checksum_alg="crc32"))
    assert parsed.checksum == "3610a686"


def test_metadata_columns_follow_go():
    parsed = parse_envelope(envelope(content_type="image/png"))
    assert parsed.metadata() == {"lfs_content_type": "image/png", "lfs_blob_size": len(BLOB),
                                 "lfs_checksum": parsed.sha256, "lfs_checksum_alg": "sha256", "lfs_bucket": "b",
                                 "lfs_key": "k"}
    assert parsed.resolved_metadata(7)["lfs_blob_size"] == 7
