"""leapp.bundle: the segment bundle, leapp's own file for one exported Warp segment.

The format is docs/bundle-format.md. This package is pure Python (no torch,
no warp), so a bundle can be written, read and inspected anywhere.

    data = write_bundle(manifest, blobs)      # bytes; BundleError names a bad field
    bundle = read_bundle(data)                # every check of the spec, in order
    bundle.digest, bundle.kernels, bundle.blob(0)
    signature_json(bundle)                    # the ONNX/PT2 `signature` string
"""

from __future__ import annotations

from leapp.bundle.format import FORMAT_VERSION, MAGIC, MIN_READER_VERSION, READER_VERSION, BundleError
from leapp.bundle.manifest import validate_manifest
from leapp.bundle.reader import Bundle, read_bundle
from leapp.bundle.signature import parse_signature, signature_json
from leapp.bundle.writer import write_bundle

__all__ = [
    "Bundle",
    "BundleError",
    "FORMAT_VERSION",
    "MAGIC",
    "MIN_READER_VERSION",
    "READER_VERSION",
    "parse_signature",
    "read_bundle",
    "signature_json",
    "validate_manifest",
    "write_bundle",
]

for _name in ("validate_manifest", "read_bundle", "write_bundle", "signature_json", "parse_signature"):
    globals()[_name].__module__ = __name__
del _name
