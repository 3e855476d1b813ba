"""leapp._contract: what the recorder hands the exporter, and the rules both sides check.

``records``: the plain data model of a traced session (the recorder builds it,
the exporter consumes it in the same process). ``names``: the rule for node and
session names. ``backends``: the export backends and their parameters. Neither
``leapp._recorder`` nor ``leapp._export`` is imported here: both depend on this
package, never on each other through it.
"""
