"""Compatibility alias: the ``.wrp`` parser is ``leapp._apic.wrp``, shared with the recorder.

Kept only until ``segment_bundle.py`` imports ``leapp._apic.wrp`` itself; then delete this file.
"""

from leapp._apic.wrp import *  # noqa: F401,F403
from leapp._apic.wrp import __all__  # noqa: F401
