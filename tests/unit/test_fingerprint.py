"""The commit in every run's fingerprint: from git, or LLMOPT_COMMIT where the tree travelled
without its .git (a GPU machine reached by copying the checkout)."""

from __future__ import annotations

import re

from llmopt_bench.run.fingerprint import git_commit, host_fingerprint


def test_commit_from_git_in_a_checkout(monkeypatch):
    monkeypatch.delenv("LLMOPT_COMMIT", raising=False)
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", git_commit() or "")


def test_llmopt_commit_names_it_without_git(monkeypatch):
    monkeypatch.setenv("LLMOPT_COMMIT", "0123abc")
    assert git_commit() == "0123abc" and host_fingerprint()["llmopt_commit"] == "0123abc"
