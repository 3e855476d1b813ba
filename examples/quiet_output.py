"""Keep an example's output to what it reports: the export's table and its checks.

Five things print on their own otherwise, none of them about the export: Warp's start-up banner and
module-load lines (Warp logs them at INFO: ``wp.config.log_level`` set to warnings before ``wp.init()``
keeps its warnings, such as a missing driver), torch's ONNX exporter
naming each torchvision op it skips when torchvision is not installed (a warning of its registration
logger), onnxscript's optimizer noting each op with several outputs it does not constant-fold, and a
``FutureWarning`` torch raises from its own pickling of a ``LeafSpec`` while saving a
program, and torch's warning that ``wp.from_torch`` reads ``.grad`` of a non-leaf tensor (Warp on the CPU).
``--verbose`` in each example leaves them all on.
"""

from __future__ import annotations

import logging
import sys
import warnings


def quiet_output(verbose: bool = False) -> None:
    if verbose:
        return
    if "warp" in sys.modules:  # an example that uses Warp imported it already; the others stay Warp-free
        wp = sys.modules["warp"]
        wp.config.log_level = wp.LOG_WARNING
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    logging.getLogger("onnxscript.optimizer._constant_folding").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
    # wp.from_torch reads .grad of the tensors an eager Warp step on the CPU gets (torch warns for non-leaves)
    warnings.filterwarnings("ignore", message=r"The \.grad attribute of a Tensor that is not a leaf", category=UserWarning)
