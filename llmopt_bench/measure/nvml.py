"""A minimal NVML binding over ctypes, so that the parent process can read GPU memory, names
and energy without importing torch or initialising CUDA (which would hold memory on the card).
Every function degrades to None / [] when NVML is absent (CPU machines, no driver)."""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any, TypedDict

_OK = 0


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t as read by the _v2/_v3 calls
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


@functools.lru_cache(maxsize=1)
def _lib() -> Any | None:
    if os.environ.get("LLMOPT_NO_NVML"):
        return None
    for name in ("libnvidia-ml.so.1", "libnvidia-ml.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        init = getattr(lib, "nvmlInit_v2", None) or getattr(lib, "nvmlInit", None)
        if init is not None and init() == _OK:
            return lib
    return None


def available() -> bool:
    return _lib() is not None


def unavailable_reason() -> str | None:
    """Why NVML cannot be used here (None when it can): what `llmopt doctor` reports."""
    if os.environ.get("LLMOPT_NO_NVML"):
        return "LLMOPT_NO_NVML is set"
    if _lib() is not None:
        return None
    for name in ("libnvidia-ml.so.1", "libnvidia-ml.so"):
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return f"{name} loads but nvmlInit fails (driver not running, or no access to /dev/nvidia*)"
    return "libnvidia-ml.so.1 not found: no NVIDIA driver on this machine"


def cuda_driver_version() -> str | None:
    """The CUDA version the driver supports, like "12.8"."""
    lib = _lib()
    if lib is None:
        return None
    fn = getattr(lib, "nvmlSystemGetCudaDriverVersion_v2", None) or getattr(lib, "nvmlSystemGetCudaDriverVersion", None)
    value = ctypes.c_int(0)
    if fn is None or fn(ctypes.byref(value)) != _OK:
        return None
    return f"{value.value // 1000}.{value.value % 1000 // 10}"


def _visible_indices(lib: Any) -> list[int]:
    count = ctypes.c_uint(0)
    if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != _OK:
        return []
    indices = list(range(count.value))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return indices
    picked = [int(v) for v in visible.split(",") if v.strip().isdigit()]
    return [i for i in picked if i in indices]


def _handle(lib: Any, index: int) -> Any:
    handle = ctypes.c_void_p()
    if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != _OK:
        return None
    return handle


def _device(index: int) -> tuple[Any, Any]:
    """(the library, the device's handle), handle None when NVML or the device is absent."""
    lib = _lib()
    return lib, (_handle(lib, index) if lib else None)


def device_indices() -> list[int]:
    """NVML indices of the GPUs this process may use (CUDA_VISIBLE_DEVICES respected)."""
    lib = _lib()
    return _visible_indices(lib) if lib else []


def driver_version() -> str | None:
    lib = _lib()
    if lib is None:
        return None
    buf = ctypes.create_string_buffer(96)
    return buf.value.decode() if lib.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(96)) == _OK else None


class DeviceInfo(TypedDict):
    index: int
    name: str
    compute_capability: str  # "9.0"
    memory_total_bytes: int


def device_info(index: int) -> DeviceInfo | None:
    lib, handle = _device(index)
    if handle is None:
        return None
    name = ctypes.create_string_buffer(96)
    lib.nvmlDeviceGetName(handle, name, ctypes.c_uint(96))
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor))
    mem = _Memory()
    lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem))
    return {
        "index": index,
        "name": name.value.decode(),
        "compute_capability": f"{major.value}.{minor.value}",
        "memory_total_bytes": int(mem.total),
    }


def used_bytes(index: int) -> int | None:
    lib, handle = _device(index)
    if handle is None:
        return None
    mem = _Memory()
    return int(mem.used) if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) == _OK else None


def process_bytes(index: int) -> dict[int, int]:
    """GPU memory per process id on one device ({} when NVML cannot say)."""
    lib, handle = _device(index)
    if handle is None:
        return {}
    for fn_name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"):
        fn = getattr(lib, fn_name, None)
        if fn is None:
            continue
        count = ctypes.c_uint(64)
        infos = (_ProcessInfo * 64)()
        if fn(handle, ctypes.byref(count), infos) == _OK:
            return {int(infos[i].pid): int(infos[i].usedGpuMemory) for i in range(count.value)}
    return {}


def energy_mj(index: int) -> int | None:
    """Total energy the device has used since the driver loaded, in millijoules (Volta+)."""
    lib, handle = _device(index)
    if handle is None:
        return None
    value = ctypes.c_ulonglong(0)
    ok = lib.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(value)) == _OK
    return int(value.value) if ok else None


def sm_clock_mhz(index: int) -> int | None:
    """The device's current SM clock, MHz (NVML_CLOCK_SM)."""
    lib, handle = _device(index)
    if handle is None:
        return None
    value = ctypes.c_uint(0)
    return int(value.value) if lib.nvmlDeviceGetClockInfo(handle, ctypes.c_uint(1), ctypes.byref(value)) == _OK else None
