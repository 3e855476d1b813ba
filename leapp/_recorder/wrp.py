"""Compatibility alias: the recorder reads ``.wrp`` files with ``leapp._apic.wrp.read_ops``.

Kept only until ``capture.py`` imports ``leapp._apic.wrp`` itself; then delete this file.
"""

from leapp._apic.wrp import WrpError, read_ops

__all__ = ["WrpError", "read_ops"]
