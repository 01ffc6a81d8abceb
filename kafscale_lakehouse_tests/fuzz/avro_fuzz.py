"""The atheris harness of the columnar Avro decoder; scripts/fuzz-avro.sh builds the sanitized extension and runs it.

Each input (fuzz/avro_inputs.py: a byte choosing the schema and framing, then the values) is decoded through
`AvroValueDecoder.decode`, as the executors decode a batch. A value that does not decode is an invalid row with its
reason, never an exception: the only exceptions taken as clean are the project's documented ones (`SchemaMappingError`,
and `pa.ArrowCapacityError` for a map of more than 2^31 entries in one batch). Any other exception, a result
`decode_input` finds broken, a crash or a sanitizer report is a finding.

`AVRO_FUZZ_EXTENSION`: the path of the extension build to load as `kafscale_lakehouse.value_formats._avro_columns` (the
sanitized one); without it the installed extension is fuzzed. The arguments are libFuzzer's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys

import atheris


def _load_extension(path: str) -> None:
    """Imports the extension at `path` under the installed one's name, before anything imports that."""
    import kafscale_lakehouse.value_formats as value_formats_package

    name = "kafscale_lakehouse.value_formats._avro_columns"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no extension module at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    value_formats_package._avro_columns = module  # type: ignore[attr-defined]


if os.environ.get("AVRO_FUZZ_EXTENSION"):
    _load_extension(os.environ["AVRO_FUZZ_EXTENSION"])

_INSTRUMENTED = [name for name in os.environ.get("AVRO_FUZZ_INSTRUMENT", "").split(",") if name]
with atheris.instrument_imports(include=_INSTRUMENTED) if _INSTRUMENTED else contextlib.nullcontext():
    import pyarrow as pa

    from kafscale_lakehouse.schema.errors import SchemaMappingError
    from kafscale_lakehouse.value_formats import avro_columns
    from kafscale_lakehouse_tests.fuzz.avro_inputs import FuzzDecoders, decode_input

if os.environ.get("AVRO_FUZZ_EXTENSION"):
    loaded = avro_columns._avro_columns.__file__
    assert loaded == os.environ["AVRO_FUZZ_EXTENSION"], f"fuzzing {loaded}, not the sanitized build"

DECODERS = FuzzDecoders()


def test_one_input(data: bytes) -> None:
    with contextlib.suppress(SchemaMappingError, pa.ArrowCapacityError):
        decode_input(DECODERS, data)


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
