"""leapp/pipeline_format/format.py: the constants, limits and schema of ``pipeline.yaml`` (docs/pipeline-format.md).

Pure Python on purpose (no torch, no Warp): ``leapp inspect`` and a future
native runner read the same description. The JSON Schema document lives
next to this file as ``pipeline.schema.json`` so that non-Python readers use
the same one.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from leapp.errors import LeappError

__all__ = [
    "PipelineError",
    "PIPELINE_FILE",
    "PIPELINE_FORMAT",
    "PIPELINE_VERSION",
    "SCHEMA_FILE",
    "MAX_FILE_BYTES",
    "MAX_DEPTH",
    "MAX_VALUES",
    "MAX_TENSOR_BYTES",
    "MAX_PIPELINE_BYTES",
    "DTYPE_BYTES",
    "schema",
    "dtype_name",
    "sha256_file",
]


class PipelineError(LeappError):
    """An exported pipeline folder is inconsistent, or a run got wrong inputs."""


PIPELINE_FILE = "pipeline.yaml"
PIPELINE_FORMAT = "leapp.pipeline"
PIPELINE_VERSION = 1
SCHEMA_FILE = Path(__file__).with_name("pipeline.schema.json")

# Bounds on what a reader parses before it looks at a single field. leapp writes a few KiB
# (about 100 values and depth 5 per node); these refuse hostile files before they cost
# memory or time (docs/pipeline-format.md, "Limits").
MAX_FILE_BYTES = 16 << 20
MAX_DEPTH = 32  # nesting of mappings and sequences, the top-level mapping being 1
MAX_VALUES = 200_000  # scalars, mappings and sequences in the document (leapp writes about 60 per node)

# Bounds on the tensors it describes (docs/pipeline-format.md, "Tensor sizes"): a runner allocates buffers
# from these shapes (leapp-run: every node output, pipeline input and output), so both readers refuse, at read
# time, a tensor above MAX_TENSOR_BYTES (a dynamic-batch tensor at its batch maximum) and a file whose tensor
# entries hold more than MAX_PIPELINE_BYTES in all. A policy at 65536 environments holds a few hundred MiB.
MAX_TENSOR_BYTES = 1 << 30
MAX_PIPELINE_BYTES = 1 << 32
MAX_INT = 2**63 - 1  # a byte count past it is shown as "more than" this (the C++ reader counts in 128 bits)

# Bytes per element of each dtype the schema allows (torch's names); the C++ reader's table is description.cpp's.
DTYPE_BYTES = {
    "bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint16": 2, "uint32": 4, "uint64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "complex32": 4, "complex64": 8, "complex128": 16,
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1,
}

_CHUNK = 1 << 20


@functools.cache
def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of pipeline.yaml ``version: 1``."""
    with open(SCHEMA_FILE, encoding="utf-8") as f:
        return json.load(f)


def dtype_name(dtype: Any) -> str:
    """'float32' for torch.float32 (the names pipeline.yaml and bundle signatures use)."""
    return str(dtype).removeprefix("torch.")


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in chunks (artifacts may be gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()
