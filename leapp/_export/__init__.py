"""leapp._export: turns recorded nodes and Warp segments into artifacts (bundles, ONNX, PT2)."""
