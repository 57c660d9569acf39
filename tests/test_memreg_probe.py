"""The memory-registration probe on fake hosts: the driver and CMA files under a root, a fake CUDA
driver (attributes, the dma-buf export), fake pyverbs (host MR, the N x 1 MiB count, DmaBufMR); every
object it creates is closed."""

import errno
import json
import types

import pytest

from afddiag.model.fabric import memreg_facts
from afddiag.probes import memreg
from afddiag.probes.cudadrv import CudaError


def _tree(tmp_path, version=None, peermem=False, meminfo="", cmdline="BOOT_IMAGE=/vmlinuz ro quiet"):
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    if version:
        (tmp_path / "proc/driver/nvidia/version").write_text(version + "\nGCC version: gcc 13\n")
    if peermem:
        (tmp_path / "sys/module/nvidia_peermem").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text("MemTotal: 127600748 kB\nMemAvailable: 100000000 kB\n" + meminfo)
    (tmp_path / "proc/cmdline").write_text(cmdline + "\n")
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.17.0-1014-nvidia\n")
    return str(tmp_path)


OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  (dvs-builder@U22)"
PROP = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Aug 21 2025"


@pytest.mark.parametrize("version,peermem,open_km", [(OPEN, False, True), (PROP, True, False), (None, False, None)])
def test_driver_flavour_and_peermem(tmp_path, version, peermem, open_km):
    d = memreg.read_driver(_tree(tmp_path, version, peermem))
    assert d["open_kernel_module"] is open_km
    assert d["peermem_loaded"] is peermem
    assert (d["version"] is None) == (version is None)
    assert bool(d["notes"]) == (version is None)


@pytest.mark.parametrize("meminfo,cmdline,total,free,kho", [
    ("CmaTotal: 65536 kB\nCmaFree: 2147483647 kB\n", "ro quiet", 65536, 2147483647, False),
    ("CmaTotal: 65536 kB\nCmaFree: 1024 kB\n", "ro kho=off quiet", 65536, 1024, True),
    ("", "ro kho=offx", None, None, False),
])
def test_cma_signature_readings(tmp_path, meminfo, cmdline, total, free, kho):
    c = memreg.read_cma(_tree(tmp_path, meminfo=meminfo, cmdline=cmdline))
    assert (c["cma_total_kb"], c["cma_free_kb"], c["kho_off"]) == (total, free, kho)
    assert c["kernel_release"] == "6.17.0-1014-nvidia"


class FakeCuda:
    """Answers like libcuda: ``attrs`` per ordinal, ``export_rc`` for cuMemGetHandleForAddressRange."""

    def __init__(self, attrs, export_error=None, has_export=True, fd=None):
        self.attrs, self.export_error, self.has_export = attrs, export_error, has_export
        self.calls, self.fd = [], fd
        self.lib = types.SimpleNamespace()

    def has(self, name):
        return name != "cuMemGetHandleForAddressRange" or self.has_export

    def first(self, *names):
        return names[0]

    def __call__(self, name, *args):
        self.calls.append(name)
        if name == "cuDeviceGetCount":
            args[0]._obj.value = len(self.attrs)
        elif name == "cuDeviceGet":
            args[0]._obj.value = args[1]
        elif name == "cuDeviceGetName":
            args[0].value = b"NVIDIA GB10"
        elif name == "cuMemAlloc_v2":
            args[0]._obj.value = 0x7F0000000000
        elif name == "cuMemGetHandleForAddressRange":
            if self.export_error:
                raise CudaError(f"cuMemGetHandleForAddressRange returned {self.export_error}")
            args[0]._obj.value = self.fd

    def attr(self, attr, dev):
        v = self.attrs[dev].get(attr)
        if v is None:
            raise CudaError("cuDeviceGetAttribute returned CUDA_ERROR_INVALID_VALUE (1)")
        return v


GB10 = {18: 1, 116: 0, 124: 1}
H200 = {18: 0, 116: 1, 124: 1}


def test_cuda_attributes_and_export_ok(tmp_path):
    import os

    r, w = os.pipe()
    os.close(w)
    fake = FakeCuda([H200], fd=r)
    out, held = memreg.read_cuda(cuda_factory=lambda: fake)
    assert out["devices"] == [{"ordinal": 0, "name": "NVIDIA GB10", "integrated": False,
                               "gpu_direct_rdma_supported": True, "dma_buf_supported": True}]
    assert out["dmabuf_export"] == {"ordinal": 0, "bytes": 2 << 20, "ok": True, "error": None}
    assert held is not None and held.fd == r
    assert held.release() == []
    with pytest.raises(OSError):  # the fd was closed by release
        os.fstat(r)
    assert fake.calls[-3:] == ["cuMemFree_v2", "cuCtxSetCurrent", "cuDevicePrimaryCtxRelease_v2"]


@pytest.mark.parametrize("kw,words", [
    ({"export_error": "CUDA_ERROR_NOT_SUPPORTED (801)"}, "CUDA_ERROR_NOT_SUPPORTED"),
    ({"has_export": False}, "older than CUDA 11.7"),
])
def test_cuda_export_refused_keeps_the_buffer_then_frees_everything(kw, words):
    fake = FakeCuda([GB10], **kw)
    out, held = memreg.read_cuda(cuda_factory=lambda: fake)
    assert held is not None and held.fd == -1 and held.ptr  # the buffer still serves the peermem test
    assert out["dmabuf_export"]["ok"] is False and words in out["dmabuf_export"]["error"]
    assert out["devices"][0]["gpu_direct_rdma_supported"] is False and out["devices"][0]["integrated"] is True
    assert held.release() == []
    assert fake.calls[-3:] == ["cuMemFree_v2", "cuCtxSetCurrent", "cuDevicePrimaryCtxRelease_v2"]


def test_cuda_missing_attribute_and_no_driver():
    out, _ = memreg.read_cuda(export=False, cuda_factory=lambda: FakeCuda([{18: 0}]))
    assert out["devices"][0]["dma_buf_supported"] is None and out["devices"][0]["notes"]

    def broken():
        raise OSError("libcuda.so.1: cannot open shared object file")

    out, held = memreg.read_cuda(cuda_factory=broken)
    assert held is None and "libcuda.so.1" in out["why"]


class VerbsError(Exception):
    def __init__(self, msg, code):
        super().__init__(msg)
        self.error_code = code


def fake_pyverbs(mr_limit=None, dmabuf_errno=None, dmabuf_typeerror=False, open_errno=None, gpu_errno=None):
    """pyverbs stand-in: MRs fail with ENOMEM past ``mr_limit`` live ones; records opens and closes."""
    log = {"open": 0, "closed": 0, "live_mrs": 0, "max_live": 0}

    class Obj:
        def __init__(self):
            log["open"] += 1

        def close(self):
            log["closed"] += 1

    class Context(Obj):
        def __init__(self, name):
            if open_errno:
                raise VerbsError(f"Failed to open device {name}", open_errno)
            super().__init__()

    class PD(Obj):
        def __init__(self, ctx):
            super().__init__()

    class MR(Obj):
        def __init__(self, pd, length, access, address=None):
            if address is not None and gpu_errno:
                raise VerbsError("Failed to register a MR. length: 2097152", gpu_errno)
            if mr_limit is not None and log["live_mrs"] >= mr_limit:
                raise VerbsError("Failed to register a MR. length: 1048576", errno.ENOMEM)
            super().__init__()
            log["live_mrs"] += 1
            log["max_live"] = max(log["max_live"], log["live_mrs"])

        def close(self):
            log["live_mrs"] -= 1
            super().close()

    class DmaBufMR(Obj):
        def __init__(self, pd, length, access, dmabuf=None, offset=0):
            if dmabuf_typeerror:
                raise TypeError("Argument 'dmabuf' has incorrect type (expected pyverbs.dmabuf.DmaBuf, got int)")
            if dmabuf_errno:
                raise VerbsError("Failed to register a dma-buf MR", dmabuf_errno)
            super().__init__()

    enums = types.SimpleNamespace(IBV_ACCESS_LOCAL_WRITE=1, IBV_ACCESS_REMOTE_WRITE=2, IBV_ACCESS_REMOTE_READ=4)
    pv = {"device": types.SimpleNamespace(Context=Context), "pd": types.SimpleNamespace(PD=PD),
          "mr": types.SimpleNamespace(MR=MR, DmaBufMR=DmaBufMR), "enums": enums}
    return pv, log


HELD = types.SimpleNamespace(dev=0, size=2 << 20, fd=7, ptr=0x7F0000000000)
NO_EXPORT = types.SimpleNamespace(dev=0, size=2 << 20, fd=-1, ptr=0x7F0000000000)


@pytest.mark.parametrize("kw,held,count,registered,cnt_errno,gpu_mr,dmabuf", [
    ({}, HELD, 16, 16, None, {"ok": True}, {"ok": True}),
    ({"mr_limit": 5}, None, 16, 5, errno.ENOMEM, None, None),  # the 6th 1 MiB registration held at once fails
    ({"dmabuf_errno": errno.EOPNOTSUPP, "gpu_errno": errno.EFAULT}, HELD, 2, 2, None,
     {"ok": False, "errno": errno.EFAULT}, {"ok": False, "errno": errno.EOPNOTSUPP}),
    ({"gpu_errno": errno.EFAULT}, NO_EXPORT, 0, None, None, {"ok": False, "errno": errno.EFAULT}, None),
    ({"dmabuf_typeerror": True}, HELD, 1, 1, None, {"ok": True}, {"ok": None}),
])
def test_register_on_device(kw, held, count, registered, cnt_errno, gpu_mr, dmabuf):
    import time

    pv, log = fake_pyverbs(**kw)
    r = memreg.register_on_device(pv, "rocep1s0f0", count, time.monotonic() + 5, held)
    assert r["host_mr"]["ok"] is True
    if count:
        assert r["host_mr_count"]["registered"] == registered
        assert r["host_mr_count"]["errno"] == cnt_errno
    else:
        assert r["host_mr_count"] is None
    for key, want in (("gpu_mr", gpu_mr), ("dmabuf_mr", dmabuf)):
        if want is None:
            assert r[key] is None, key
        else:
            assert {k: r[key].get(k) for k in want} == want, key
    assert r["destroyed"] is True and log["open"] == log["closed"] and log["live_mrs"] == 0


def test_registration_count_stops_at_deadline():
    pv, log = fake_pyverbs()
    r = memreg.register_on_device(pv, "mlx5_0", 50, 0.0, None)  # deadline already past
    assert r["host_mr_count"]["registered"] == 0 and r["host_mr_count"]["stopped_by_deadline"] is True
    assert log["open"] == log["closed"]


def test_open_failure_is_recorded_not_raised():
    pv, log = fake_pyverbs(open_errno=errno.ENODEV)
    r = memreg.register_on_device(pv, "mlx5_9", 4, 1e18, None)
    assert r["open_error"]["errno"] == errno.ENODEV and r["host_mr"] is None


def test_read_memreg_whole_probe_and_facts(tmp_path):
    root = _tree(tmp_path, OPEN, meminfo="CmaTotal: 65536 kB\nCmaFree: 70000 kB\n")
    pv, log = fake_pyverbs(mr_limit=8)
    r = memreg.read_memreg(root, timeout_s=4, count=16, cuda_factory=lambda: FakeCuda([GB10],
                           export_error="CUDA_ERROR_NOT_SUPPORTED (801)"), pyverbs=pv,
                           device_names=["rocep1s0f0", "roceP2p1s0f0"])
    json.dumps(r)  # plain JSON: it is the capture artifact
    f = memreg_facts(json.loads(json.dumps(r)))
    assert f.open_kernel_module is True and f.cma_free_kb == 70000 and f.kho_off is False
    assert f.gpus[0]["gpu_direct_rdma_supported"] is False and f.dmabuf_export["ok"] is False
    assert [d["name"] for d in f.devices] == ["rocep1s0f0", "roceP2p1s0f0"]
    assert all(d["dmabuf_mr"] is None and d["host_mr_count"]["registered"] == 8 for d in f.devices)
    assert all(d["gpu_mr"]["ok"] is True for d in f.devices)  # the fake registers device pointers
    assert log["open"] == log["closed"]


@pytest.mark.parametrize("raw", [None, [], "x", {"driver": 5, "cuda": [], "verbs": {"devices": [1, {"name": 2}]}}])
def test_facts_from_odd_readings_never_raise(raw):
    f = memreg_facts(raw)
    assert f.devices == [] and f.gpus == []
    assert f.captured is (isinstance(raw, dict))
