"""leapp/pipeline_format/twin.py: ``pipeline.json``, the JSON twin of ``pipeline.yaml`` for native readers.

The C++ runner (``ext/pipeline``) reads the wiring with leapp's strict native JSON
parser instead of a YAML library. The twin holds exactly the description that
``pipeline.yaml`` holds (same schema, ``pipeline.schema.json``) plus one key,
``pipeline_yaml_sha256``: the sha256 of the ``pipeline.yaml`` it was made from. A
native reader refuses a twin whose recorded digest is not that of the
``pipeline.yaml`` next to it, so the two cannot disagree unnoticed (an edited
``pipeline.yaml`` needs ``leapp write-json`` again). Python's readers (``leapp.load``,
``leapp inspect``, the validation worker) read ``pipeline.yaml`` and, where a twin exists,
refuse the folder unless the twin holds that digest and the same description
(``reader.check_twin``).
"""

from __future__ import annotations

import json
from pathlib import Path

from .format import PIPELINE_FILE, sha256_file
from .reader import TWIN_DIGEST_KEY, TWIN_FILE, read_pipeline

__all__ = ["TWIN_FILE", "TWIN_DIGEST_KEY", "twin_text", "write_twin"]


def twin_text(description: dict, yaml_sha256: str) -> str:
    """The text of pipeline.json for ``description`` read from a pipeline.yaml whose sha256 is ``yaml_sha256``.

    Not validated here: the exporter validates the description before it writes either file, and the
    tests write twins of deliberately broken descriptions to check both readers refuse them alike."""
    twin = {key: value for key, value in description.items() if key != TWIN_DIGEST_KEY}
    twin[TWIN_DIGEST_KEY] = yaml_sha256
    return json.dumps(twin, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def write_twin(folder: str | Path, description: dict | None = None) -> Path:
    """Writes ``folder/pipeline.json`` for ``folder/pipeline.yaml``; returns its path.

    Without ``description`` the folder's pipeline.yaml is read and checked first (``read_pipeline``):
    this is how an export made before the twin existed gets one (``leapp write-json``).
    """
    if description is None:
        folder, description = read_pipeline(folder, twin=False)  # the twin there may be the stale one replaced
    folder = Path(folder)
    path = folder / TWIN_FILE
    text = twin_text(description, sha256_file(folder / PIPELINE_FILE))
    temporary = path.with_name(f".{TWIN_FILE}.tmp")
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(text)
    temporary.replace(path)  # a reader never sees half a twin
    return path
