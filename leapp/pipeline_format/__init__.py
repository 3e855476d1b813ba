"""leapp.pipeline_format: the ``pipeline.yaml`` of an export folder, defined once (docs/pipeline-format.md).

The writer (``leapp._export.pipeline_yaml``), the loader (``leapp.load``) and
``leapp inspect`` all go through this package: the constants and limits, the
JSON Schema (``pipeline.schema.json``), the safe reader and the containment
rule for the paths the file names. It needs neither torch nor Warp.
"""

from __future__ import annotations

from .format import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_VALUES,
    PIPELINE_FILE,
    PIPELINE_FORMAT,
    PIPELINE_VERSION,
    SCHEMA_FILE,
    PipelineError,
    dtype_name,
    schema,
    sha256_file,
)
from .paths import contained_path
from .reader import field_path, parse_description, read_pipeline, validate_description

__all__ = [
    "PipelineError",
    "PIPELINE_FILE",
    "PIPELINE_FORMAT",
    "PIPELINE_VERSION",
    "SCHEMA_FILE",
    "MAX_FILE_BYTES",
    "MAX_DEPTH",
    "MAX_VALUES",
    "schema",
    "dtype_name",
    "sha256_file",
    "contained_path",
    "field_path",
    "parse_description",
    "read_pipeline",
    "validate_description",
]
