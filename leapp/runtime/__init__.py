"""Running exported artifacts: native op libraries, the torch op, validation, pipelines."""

from leapp.runtime.release import release_segments

__all__ = ["release_segments"]
