"""The outputs' part of the exchange in device memory (cuda): the trusted reference process allocates it for one run
and hands it to that run's runner as a file descriptor; the runner copies each call's whole output and its inputs
as the call left them there, device to device, inside the parent's clock; the reference process reads it in
place (sampled positions, or whole for checked calls). A call's data then never crosses the host bus: a 256 MiB
output and its input took 12-16 ms a call as page-locked host copies, against well under a millisecond here.

Sharing goes through CUDA's virtual memory management API (``cuMemCreate`` with a POSIX file descriptor as its
shareable handle), called through the driver library with ctypes: a descriptor passes between processes over a
Unix socket (``SCM_RIGHTS``) whatever their PID and IPC namespaces, where CUDA's legacy IPC handles do not.

The allocation is fresh for each run and zeroed before the runner gets it: nothing one candidate wrote, and
nothing the reference process computed, is there for the next.
"""
from __future__ import annotations

import ctypes
from typing import Any

import torch

_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_ON_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_READ_WRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
_GRANULARITY_MINIMUM = 0


class DeviceExchangeError(RuntimeError):
    """The driver refused a step of sharing device memory (the run falls back to the host region)."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_driver: Any = None


def driver() -> Any:
    """The CUDA driver library, loaded once (a runner loads it while it starts, before any candidate code)."""
    global _driver
    if _driver is None:
        try:
            _driver = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise DeviceExchangeError(f"the CUDA driver library cannot be loaded ({exc})") from None
    return _driver


def _check(name: str, *args: Any) -> None:
    status = getattr(driver(), name)(*args)
    if status != 0:
        text = ctypes.c_char_p()
        driver().cuGetErrorString(status, ctypes.byref(text))
        raise DeviceExchangeError(f"{name} failed: {(text.value or b'').decode() or status}")


class _CudaArray:
    """What ``torch.as_tensor`` needs to see a raw device range as a uint8 tensor without copying it."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None}


class DeviceRegion:
    """One shared allocation mapped into this process: ``bytes`` is a uint8 tensor over it."""

    def __init__(self, handle: int, nbytes: int, device: torch.device) -> None:
        self.handle, self.nbytes, self.device = handle, nbytes, device
        self.ptr = ctypes.c_uint64()
        _check("cuMemAddressReserve", ctypes.byref(self.ptr), ctypes.c_size_t(nbytes), ctypes.c_size_t(0),
               ctypes.c_uint64(0), ctypes.c_ulonglong(0))
        try:
            _check("cuMemMap", self.ptr, ctypes.c_size_t(nbytes), ctypes.c_size_t(0), ctypes.c_uint64(handle),
                   ctypes.c_ulonglong(0))
            access = _AccessDesc(_Location(_ON_DEVICE, _ordinal(device)), _READ_WRITE)
            _check("cuMemSetAccess", self.ptr, ctypes.c_size_t(nbytes), ctypes.byref(access), ctypes.c_size_t(1))
        except DeviceExchangeError:
            self.close()
            raise
        self.bytes = torch.as_tensor(_CudaArray(self.ptr.value, nbytes), device=device)

    @classmethod
    def create(cls, nbytes: int, device: torch.device) -> "DeviceRegion":
        """A fresh allocation of at least ``nbytes`` on ``device``, zeroed."""
        _current(device)
        prop = _AllocationProp(_PINNED, _POSIX_FD, _Location(_ON_DEVICE, _ordinal(device)))
        granularity = ctypes.c_size_t()
        _check("cuMemGetAllocationGranularity", ctypes.byref(granularity), ctypes.byref(prop), _GRANULARITY_MINIMUM)
        size = max(1, -(-nbytes // granularity.value)) * granularity.value
        handle = ctypes.c_uint64()
        _check("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_ulonglong(0))
        region = cls(handle.value, size, device)
        region.bytes.zero_()
        torch.cuda.synchronize(device)
        return region

    @classmethod
    def import_fd(cls, fd: int, nbytes: int, device: torch.device) -> "DeviceRegion":
        """The allocation another process exported as ``fd`` (``export_fd``), ``nbytes`` long, mapped here."""
        _current(device)
        handle = ctypes.c_uint64()
        _check("cuMemImportFromShareableHandle", ctypes.byref(handle), ctypes.c_void_p(fd), _POSIX_FD)
        return cls(handle.value, nbytes, device)

    def export_fd(self) -> int:
        """A new file descriptor standing for the allocation (the caller sends it, then closes it)."""
        fd = ctypes.c_int(-1)
        _check("cuMemExportToShareableHandle", ctypes.byref(fd), ctypes.c_uint64(self.handle), _POSIX_FD,
               ctypes.c_ulonglong(0))
        return fd.value

    def close(self) -> None:
        """Unmap and release this process's hold on it (the memory goes when every process has let go)."""
        self.bytes = None
        if self.ptr.value:
            driver().cuMemUnmap(self.ptr, ctypes.c_size_t(self.nbytes))
            driver().cuMemAddressFree(self.ptr, ctypes.c_size_t(self.nbytes))
            self.ptr = ctypes.c_uint64()
        if self.handle:
            driver().cuMemRelease(ctypes.c_uint64(self.handle))
            self.handle = 0


def _ordinal(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _current(device: torch.device) -> None:
    """The driver calls act on the calling thread's current context: an allocation by torch makes the device's
    primary context current on this thread."""
    torch.empty(1, device=device)
