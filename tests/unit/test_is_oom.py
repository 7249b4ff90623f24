"""errors.is_oom on the failures a probe really meets: torch's CPU allocator raises a
RuntimeError ("DefaultCPUAllocator: can't allocate memory"), not MemoryError, and it is an
out-of-memory answer (a capacity probe's oom), not an error."""

from __future__ import annotations

import errno

import pytest

from llmopt_bench.core.errors import is_oom


def test_torch_cpu_allocation_failure_is_oom():
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as failed:
        torch.empty(1 << 62, dtype=torch.uint8)  # 4 EiB: no host can give it
    assert is_oom(failed.value), str(failed.value)


def test_host_enomem_is_oom_and_other_errors_are_not():
    assert is_oom(MemoryError())
    assert is_oom(OSError(errno.ENOMEM, "Cannot allocate memory"))
    assert not is_oom(OSError(errno.ENOENT, "No such file or directory"))
    assert not is_oom(RuntimeError("shape mismatch: [2, 3] vs [3, 2]"))
    assert not is_oom(ValueError("unknown configuration 'x'"))
