"""leapp/pipeline_format/twin.py: ``pipeline.json``, the JSON twin of ``pipeline.yaml`` for native readers.

The C++ runner (``ext/pipeline``) reads the wiring with leapp's strict native JSON
parser instead of a YAML library. The twin holds exactly the description that
``pipeline.yaml`` holds (same schema, ``pipeline.schema.json``) plus one key,
``pipeline_yaml_sha256``: the sha256 of the ``pipeline.yaml`` it was made from, and
``pipeline.yaml`` is the description's canonical text (``yaml_text``). Every reader
(``leapp.load``, ``leapp inspect``, the validation worker, leapp-run) refuses a folder
unless ``pipeline.yaml`` has that digest and is the twin's rendering, byte for byte
(``reader.check_twin``, ``ext/pipeline/src/description.cpp``): the two cannot disagree,
and an edited ``pipeline.yaml`` needs ``leapp write-json`` again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .format import PIPELINE_FILE
from .reader import TWIN_DIGEST_KEY, TWIN_FILE, read_pipeline
from .yaml_text import yaml_text

__all__ = ["twin_text", "write_twin"]


def twin_text(description: dict, yaml_sha256: str) -> str:
    """The text of pipeline.json for ``description`` read from a pipeline.yaml whose sha256 is ``yaml_sha256``.

    Not validated here: the exporter validates the description before it writes either file, and the
    tests write twins of deliberately broken descriptions to check both readers refuse them alike."""
    twin = {key: value for key, value in description.items() if key != TWIN_DIGEST_KEY}
    twin[TWIN_DIGEST_KEY] = yaml_sha256
    return json.dumps(twin, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def write_twin(folder: str | Path, description: dict | None = None) -> Path:
    """Writes ``folder/pipeline.json`` for ``description`` and, where its bytes differ, ``folder/pipeline.yaml``
    as the description's canonical text (``yaml_text``); returns the twin's path.

    Without ``description`` the folder's pipeline.yaml is read and checked first (``read_pipeline``): this
    is how an export made before the twin existed, or a pipeline.yaml edited by hand, gets the pair again
    (``leapp write-json``). Each file is replaced whole: a reader never sees half of one.
    """
    if description is None:
        folder, description = read_pipeline(folder, twin=False)  # the twin there may be the stale one replaced
    folder = Path(folder)
    text = yaml_text(description).encode("utf-8")
    yaml_file = folder / PIPELINE_FILE
    if not yaml_file.is_file() or yaml_file.read_bytes() != text:
        _replace(yaml_file, text)
    path = folder / TWIN_FILE
    _replace(path, twin_text(description, hashlib.sha256(text).hexdigest()).encode("utf-8"))
    return path


def _replace(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as f:
        f.write(data)
    temporary.replace(path)
