"""leapp.signing: signed exports (docs/signing.md; issue 50).

``leapp sign`` writes ``EXPORT/model.sig`` in the OpenSSF model-signing format (``sign``, through the
model-signing library: ``pip install 'leapp[signing]'``); ``leapp.load(path, trust=...)``, ``leapp verify``,
leapp-run ``--trust`` and ``leapp ros2 --trust`` check it with the one native verifier before anything of the
folder is parsed (``trust``), and every file the loader then reads against the signed digest (``readonce``).
Importing this package imports neither model-signing nor any crypto library.
"""

from __future__ import annotations

from .readonce import CHANGED_AFTER_CHECK, NOT_SIGNED, SignedFolder, check_read, reading
from .trust import SIGNATURE_FILE, TRUST_ENV, check_export, read_keys, trusted_keys, verify_folder

__all__ = ["CHANGED_AFTER_CHECK", "NOT_SIGNED", "SIGNATURE_FILE", "TRUST_ENV", "SignedFolder", "check_export",
           "check_read", "read_keys", "reading", "trusted_keys", "verify_folder"]
