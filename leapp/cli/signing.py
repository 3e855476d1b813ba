"""leapp/cli/signing.py: ``leapp sign EXPORT_DIR --key KEY.pem`` and ``leapp verify EXPORT_DIR --trust PUB.pem``.

Both are thin: ``leapp.signing.sign`` signs with the model-signing library, ``leapp.signing.trust`` checks with
the native verifier that ``leapp.load`` and leapp-run use (docs/signing.md). Exit status: 0 done, 1 refused (the
reason on stderr), 2 a usage problem (no key configured).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys

__all__ = ["add_commands", "read_password", "sign_command", "verify_command"]


def add_commands(commands) -> None:
    """The ``sign`` and ``verify`` parsers, on ``leapp``'s subparsers."""
    sign = commands.add_parser(
        "sign",
        help="sign an export folder: EXPORT_DIR/model.sig in the OpenSSF model-signing format (needs leapp[signing])",
        description="Sign every file of EXPORT_DIR with a private key (elliptic curve P-256, P-384 or P-521, PEM) and "
        "write EXPORT_DIR/model.sig, as `model_signing sign key` (or `sign certificate`) does: upstream's "
        "`model_signing verify` accepts it, and leapp.load(..., trust=PUB), `leapp verify` and leapp-run --trust "
        "check it (docs/signing.md).",
    )
    sign.add_argument("export_dir", metavar="EXPORT_DIR", help="an export folder with pipeline.yaml")
    sign.add_argument("--key", metavar="PRIVATE_KEY.pem", required=True, help="the PEM private key to sign with")
    sign.add_argument("--password-from", metavar="SOURCE", default=None,
                      help="where the encrypted private key's password is: env:NAME (an environment variable), "
                      "file:PATH (the file's first line) or stdin (one line; asked for on a terminal). It is never "
                      "an argument: other users of the machine read arguments in the process list")
    sign.add_argument("--password", default=None, help=argparse.SUPPRESS)  # refused by name, never echoed
    sign.add_argument("--certificate", metavar="CERT.pem", default=None,
                      help="sign with this certificate of the key (the signature carries it instead of the key's hint)")
    sign.add_argument("--certificate-chain", metavar="CHAIN.pem", action="append", default=[],
                      help="a certificate of the chain up to the root (repeatable; with --certificate)")
    verify = commands.add_parser(
        "verify",
        help="check an export folder's signature (model.sig) against trusted public keys",
        description="Check EXPORT_DIR/model.sig against the trusted keys and every file of EXPORT_DIR against it, "
        "with the verifier leapp.load and leapp-run use. Keys: --trust (repeatable), else the ':'-separated paths "
        "in LEAPP_TRUST. Exit status 0 when it verifies, 1 when refused (the reason on stderr), 2 when no key is "
        "configured.",
    )
    verify.add_argument("export_dir", metavar="EXPORT_DIR", help="a signed export folder")
    verify.add_argument("--trust", metavar="PUB.pem", action="append", default=None,
                        help="a trusted PEM public key (repeatable: one of them must have signed the folder)")


class _PasswordSourceError(Exception):
    pass


_PASSWORD_LIMIT = 4096  # characters: a line read from a file or stdin stops here (a device or a huge file)


def _one_line(stream, source: str) -> str:
    line = stream.readline(_PASSWORD_LIMIT + 1)
    if len(line.rstrip("\r\n")) > _PASSWORD_LIMIT:
        raise _PasswordSourceError(f"--password-from {source}: its first line is longer than {_PASSWORD_LIMIT} "
                                   "characters: not a password")
    return line.rstrip("\r\n")


def read_password(source: str) -> str:
    """The password that ``source`` names (``env:NAME``, ``file:PATH`` or ``stdin``), as OpenSSL's ``-passin``
    takes it: one line (at most 4096 characters), its line ending removed."""
    kind, _, rest = source.partition(":")
    if kind == "env" and rest:
        if rest not in os.environ:
            raise _PasswordSourceError(f"--password-from {source}: the environment has no variable {rest}")
        return os.environ[rest]
    if kind == "file" and rest:
        try:
            with open(rest, encoding="utf-8") as f:
                return _one_line(f, source)
        except (OSError, UnicodeDecodeError) as e:
            raise _PasswordSourceError(f"--password-from {source}: cannot read it: {e}") from None
    if source == "stdin":
        if sys.stdin is not None and sys.stdin.isatty():
            return getpass.getpass("private key password: ")
        return _one_line(sys.stdin, source) if sys.stdin is not None else ""
    # the value is not repeated: a careless user may have put the password itself here
    raise _PasswordSourceError("--password-from: give env:NAME, file:PATH or stdin (the value given is not shown)")


def sign_command(args: argparse.Namespace) -> int:
    from leapp.errors import SignatureError
    from leapp.signing.sign import sign_folder

    if args.certificate_chain and args.certificate is None:
        print("leapp sign: --certificate-chain needs --certificate", file=sys.stderr)
        return 2
    if args.password is not None:
        print("leapp sign: --password is refused: every user of the machine can read a command line in the "
              "process list; give --password-from env:NAME, file:PATH or stdin", file=sys.stderr)
        return 2
    try:
        password = None if args.password_from is None else read_password(args.password_from)
    except _PasswordSourceError as e:
        print(f"leapp sign: {e}", file=sys.stderr)
        return 2
    try:
        out = sign_folder(args.export_dir, args.key, password=password, certificate=args.certificate,
                          certificate_chain=args.certificate_chain)
    except SignatureError as e:
        print(f"leapp sign: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


def verify_command(args: argparse.Namespace) -> int:
    from leapp.errors import SignatureError
    from leapp.signing.trust import TRUST_ENV, trusted_keys, verify_folder

    try:
        keys = trusted_keys(args.trust)
        if keys is None:
            print(f"leapp verify: no trusted key: give --trust PUB.pem or set {TRUST_ENV}", file=sys.stderr)
            return 2
        digests = verify_folder(args.export_dir, keys)
    except SignatureError as e:
        print(f"leapp verify: {e}", file=sys.stderr)
        return 1
    print(f"{args.export_dir}: signature verified: {len(digests)} files signed by a trusted key")
    return 0
