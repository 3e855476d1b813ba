"""leapp/_recorder: scoped recording of leapp nodes (torch FX) and Warp segments (APIC).

The public face is ``leapp.trace`` / ``leapp.node`` / ``leapp.annotate``; the
output is the plain data model of ``leapp._contract.records``.
"""
