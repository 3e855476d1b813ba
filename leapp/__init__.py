"""leapp: export PyTorch + NVIDIA Warp pipelines to ONNX and PT2.
"""
