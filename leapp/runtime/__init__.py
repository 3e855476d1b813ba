"""Running exported artifacts: native op libraries, the torch op, validation, pipelines."""
