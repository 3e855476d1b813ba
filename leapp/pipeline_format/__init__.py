"""leapp.pipeline_format: the ``pipeline.yaml`` of an export folder, defined once (docs/pipeline-format.md).

The writer (``leapp._export.pipeline_yaml``), the loader (``leapp.load``) and
``leapp inspect`` all go through this package: the constants and limits, the
JSON Schema (``pipeline.schema.json``), the safe reader and the containment
rule for the paths the file names. It needs neither torch nor Warp.
"""

from __future__ import annotations

from .format import *  # noqa: F403 - the constants, limits, PipelineError and schema helpers
from .format import __all__ as _FORMAT_NAMES
from .initial_values import (INITIAL_VALUES_FILE, MAX_INITIAL_HEADER_BYTES, SAFETENSORS_DTYPES, StateEdge,
                             check_initial_values, state_edges)
from .metadata import MAX_METADATA_BYTES, MAX_METADATA_DEPTH, metadata_problem
from .paths import CheckedFile, contained_path, is_regular_file, max_artifact_bytes, read_bounded, read_checked
from .reader import (TWIN_DIGEST_KEY, TWIN_FILE, field_path, parse_description, read_pipeline, short_repr,
                     validate_description)
from .twin import twin_text, write_twin
from .yaml_text import yaml_text

__all__ = [*_FORMAT_NAMES, "INITIAL_VALUES_FILE", "MAX_INITIAL_HEADER_BYTES", "SAFETENSORS_DTYPES", "StateEdge",
           "check_initial_values", "state_edges", "MAX_METADATA_BYTES", "MAX_METADATA_DEPTH", "metadata_problem", "CheckedFile", "contained_path", "is_regular_file", "max_artifact_bytes",
           "read_bounded", "read_checked", "field_path", "parse_description", "read_pipeline",
           "validate_description", "short_repr", "TWIN_DIGEST_KEY", "TWIN_FILE", "twin_text", "write_twin", "yaml_text"]
