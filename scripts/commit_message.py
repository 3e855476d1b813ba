"""scripts/commit_message.py: the rules of a commit message here (docs/building.md, "Commit messages").

A subject of at most 72 characters in the imperative ("Refuse views at offsets", not "Refused ..." or
"runtime.py: ..."), no final period, then a blank line and the why in the body. Used by the commit-msg hook
(`git config core.hooksPath scripts/git-hooks`) and by tests/foundation/test_commit_messages.py, which checks
every commit since the rules were adopted.

    python3 scripts/commit_message.py MESSAGE_FILE        # the hook: exit 1 with the problems
    python3 scripts/commit_message.py --range BASE..HEAD  # every commit in a range
"""

from __future__ import annotations

import subprocess
import sys

MAX_SUBJECT = 72
# The commit after which every message follows these rules (the ones before are history, not rewritten).
ADOPTED_AFTER = "f2770b0"
# Imperative verbs that merely end like a past tense.
_ED_VERBS = {"embed", "feed", "need", "seed", "speed", "shed", "bleed", "breed", "proceed", "exceed", "succeed"}
# Third-person forms seen in subjects that describe instead of command.
_THIRD_PERSON = {"adds", "fixes", "makes", "removes", "updates", "uses", "moves", "renames", "changes", "improves",
                 "replaces", "refuses", "keeps", "runs", "checks", "records", "says", "gives", "takes", "lets"}


def problems(message: str) -> list[str]:
    """What is wrong with a commit message (empty: nothing). Comment lines (git's '#') are ignored."""
    lines = [line for line in message.splitlines() if not line.startswith("#")]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines or not lines[0].strip():
        return ["the subject (first line) is empty"]
    subject = lines[0]
    found = []
    if len(subject) > MAX_SUBJECT:
        found.append(f"the subject has {len(subject)} characters, at most {MAX_SUBJECT}: put the why in the body")
    if subject.rstrip().endswith("."):
        found.append("the subject ends with a period")
    first = subject.split()[0]
    if not first[0].isupper():
        found.append(f"the subject starts with '{first}': start with a capitalised verb in the imperative")
    if ":" in first:
        found.append(f"the subject starts with '{first}': say what the commit does, not which file it touches")
    word = first.lower().rstrip(":,")
    if word.endswith("ing") or (word.endswith("ed") and word not in _ED_VERBS) or word in _THIRD_PERSON:
        found.append(f"'{first}' is not the imperative (write 'Add', not 'Added', 'Adds' or 'Adding')")
    if len(lines) > 1 and lines[1].strip():
        found.append("the second line is not blank: a blank line separates the subject from the body")
    return found


def _range_messages(spec: str) -> list[tuple[str, str]]:
    out = subprocess.run(["git", "log", "--no-merges", "--format=%h%x00%B%x01", spec], capture_output=True,
                         text=True, check=True).stdout
    commits = []
    for record in out.split("\x01"):
        if "\x00" in record:
            sha, body = record.strip("\n").split("\x00", 1)
            commits.append((sha, body))
    return commits


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--range":
        bad = [(sha, p) for sha, body in _range_messages(argv[1]) for p in problems(body)]
        for sha, p in bad:
            print(f"{sha}: {p}", file=sys.stderr)
        return 1 if bad else 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        found = problems(f.read())
    for p in found:
        print(f"commit-msg: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
