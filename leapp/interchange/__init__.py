"""leapp.interchange: files in formats other tools read, written from an export folder (leapp never reads them).

``write_leapp_bundle`` writes the existing LEAPP tool's ``<name>.yaml`` (its ``InferenceManager``, Isaac ROS Deploy,
Isaac Lab's deploy commands read it) next to ``pipeline.yaml``: docs/leapp-bundle.md.
"""

from __future__ import annotations

from .leapp_bundle import OLD_DTYPES, LeappBundleError, LeappBundleWarning, bundle_description, write_leapp_bundle

__all__ = ["OLD_DTYPES", "LeappBundleError", "LeappBundleWarning", "bundle_description", "write_leapp_bundle"]
