"""RunDir's writes: atomic (the previous file stays whole whatever happens), a full disk said
with the path and the exit code, temporary files never left behind."""

from __future__ import annotations

import errno
import os

import pytest

from llmopt_bench.core.errors import ExitCode, LlmoptError
from llmopt_bench.run.rundir import RunDir, atomic_write


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "run.json"
    atomic_write(path, "first")
    atomic_write(path, "second")
    assert path.read_text() == "second" and os.listdir(tmp_path) == ["run.json"]


def test_a_full_disk_keeps_the_previous_file_and_says_so(tmp_path, monkeypatch):
    path = tmp_path / "run.json"
    atomic_write(path, '{"ok": true}')
    real_fsync = os.fsync

    def no_space(fd):  # the disk fills up as the new content is flushed to it
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(LlmoptError) as e:
        atomic_write(path, '{"ok": false}' * 1000)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert e.value.code == ExitCode.DISK_FULL == 7
    assert str(path) in e.value.message and "MB needed" in e.value.message and "df -h" in e.value.fix
    assert path.read_text() == '{"ok": true}' and os.listdir(tmp_path) == ["run.json"]


def test_a_torn_requests_line_is_skipped_with_a_warning(tmp_path, capsys):
    rd = RunDir(tmp_path)
    rd.requests.write_text('{"stage": "a", "x": 1}\n{"stage": "a", "x"')
    assert rd.request_lines() == [{"stage": "a", "x": 1}]
    assert "1 torn line(s) skipped" in capsys.readouterr().err


def test_output_that_is_a_file_is_a_usage_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(LlmoptError) as e:
        RunDir(f).create()
    assert e.value.code == ExitCode.USAGE and "a file" in e.value.message
