"""Commit messages: the rules of scripts/commit_message.py, and every commit since they were adopted follows them
(the same check the commit-msg hook makes; docs/building.md, "Commit messages")."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("commit_message", ROOT / "scripts" / "commit_message.py")
commit_message = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(commit_message)


@pytest.mark.parametrize("message", [
    "Refuse views at offsets\n\nWhy it matters.\n",
    "Embed the PTX in the bundle",
    "Keep each captured segment graph alive until its node run ends\n\nbody\n# git's comment\n",
])
def test_good_messages_pass(message):
    assert commit_message.problems(message) == []


@pytest.mark.parametrize("message, problem", [
    ("", "empty"),
    ("x" * 73, "73 characters"),
    ("Refuse views at offsets.", "period"),
    ("refuse views", "capitalised"),
    ("performance.md: the table", "which file"),
    ("Added the flag", "imperative"),
    ("Adds the flag", "imperative"),
    ("Adding the flag", "imperative"),
    ("Refuse views\nbody right below", "blank"),
])
def test_bad_messages_are_named(message, problem):
    found = commit_message.problems(message)
    assert any(problem in p for p in found), found


def test_every_commit_since_the_rules_were_adopted_follows_them():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no history to check")
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit_message.ADOPTED_AFTER}^{{commit}}"],
                           capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"{commit_message.ADOPTED_AFTER} is not in this clone (a shallow clone): no history to check")
    bad = [(sha, p) for sha, body in commit_message._range_messages(f"{commit_message.ADOPTED_AFTER}..HEAD")
           for p in commit_message.problems(body)]
    assert not bad, "\n".join(f"{sha}: {p}" for sha, p in bad)
