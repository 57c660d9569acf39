"""The live GPU probe (afddiag.probes.gpu) against fake NVML/CUDA, and on whatever host runs it."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
import sys
import threading
import time
import types

import pytest

from afddiag.probes import cudadrv, gpu, gpu_nvml, xid

NOT_SUPPORTED_RC = 3


def _lib_loads(name: str) -> bool:
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


HAVE_GPU_LIBS = _lib_loads("libcuda.so.1") or _lib_loads("libnvidia-ml.so.1")


# --- fakes ----------------------------------------------------------------------------------


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 999: "Unknown Error"}.get(self.value, f"NVML error {self.value}")


def fake_nvml_device(uuid: str, name: str = "NVIDIA H200", **over) -> dict:
    """What one fake NVML device answers; a value that is an int exception code raises it."""
    d = {
        "name": name,
        "uuid": uuid,
        "bus": "00000000:18:00.0",
        "attrs": FakeNVMLError(NOT_SUPPORTED_RC),
        "mem": types.SimpleNamespace(total=150754820096, used=500170752, free=150254649344),
        "clock": 345,
        "max_clock": 1980,
        "power": 75000,
        "limit": 700000,
        "pstate": 0,
        "reasons": 0x1,
        "temp": 30,
        "gen": 5,
        "width": 16,
        "util": 0,
        # health facts, as an H200 answers them (ECC on, row remapping, no retired pages)
        "ecc_mode": [1, 1],
        "ecc": {(0, 0): 0, (1, 0): 0, (0, 1): 0, (1, 1): 0},  # (error type, counter type) -> count
        "retired": {0: FakeNVMLError(NOT_SUPPORTED_RC), 1: FakeNVMLError(NOT_SUPPORTED_RC)},
        "retired_pending": FakeNVMLError(NOT_SUPPORTED_RC),
        "remapped": (0, 0, 0, 0),
        "compute_procs": [],
        "graphics_procs": [],
    }
    d.update(over)
    return d


def make_fake_pynvml(devices: list[dict], block: threading.Event | None = None, block_in: str = "",
                     with_event_reasons: bool = True, cuda_version: int | None = None) -> types.ModuleType:
    """A module with pynvml's names; ``block_in`` names a call that waits on ``block`` forever.
    ``cuda_version``: answer ``nvmlSystemGetCudaDriverVersion_v2`` and, for devices with ``"cc"``,
    ``nvmlDeviceGetCudaComputeCapability`` (as the H200 did); None: bindings without them."""
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED_RC
    m.NVML_ERROR_LIBRARY_NOT_FOUND = 12
    m.NVML_CLOCK_SM = 1
    m.NVML_TEMPERATURE_GPU = 0
    m.NVML_FEATURE_ENABLED = 1
    m.NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    m.NVML_VOLATILE_ECC = 0
    m.NVML_AGGREGATE_ECC = 1
    m.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    m.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    m.calls = []

    def answer(fn_name, value):
        m.calls.append(fn_name)
        if fn_name == block_in:
            block.wait()
        if isinstance(value, Exception):
            raise value
        return value

    m.nvmlInit = lambda: m.calls.append("nvmlInit")
    m.nvmlShutdown = lambda: m.calls.append("nvmlShutdown")
    m.nvmlSystemGetDriverVersion = lambda: answer("nvmlSystemGetDriverVersion", "580.159.04")
    m.nvmlSystemGetNVMLVersion = lambda: answer("nvmlSystemGetNVMLVersion", "13.580.159.04")
    m.nvmlDeviceGetCount = lambda: answer("nvmlDeviceGetCount", len(devices))
    m.nvmlDeviceGetHandleByIndex = lambda i: answer("nvmlDeviceGetHandleByIndex", devices[i])
    m.nvmlDeviceGetName = lambda h: answer("nvmlDeviceGetName", h["name"].encode())  # old bindings: bytes
    m.nvmlDeviceGetUUID = lambda h: answer("nvmlDeviceGetUUID", h["uuid"])
    m.nvmlDeviceGetPciInfo = lambda h: answer("nvmlDeviceGetPciInfo", types.SimpleNamespace(busId=h["bus"]))
    m.nvmlDeviceGetAttributes = lambda h: answer(
        "nvmlDeviceGetAttributes",
        h["attrs"] if isinstance(h["attrs"], Exception) else types.SimpleNamespace(multiprocessorCount=h["attrs"]),
    )
    m.nvmlDeviceGetMemoryInfo = lambda h: answer("nvmlDeviceGetMemoryInfo", h["mem"])
    m.nvmlDeviceGetClockInfo = lambda h, t: answer("nvmlDeviceGetClockInfo", h["clock"])
    m.nvmlDeviceGetMaxClockInfo = lambda h, t: answer("nvmlDeviceGetMaxClockInfo", h["max_clock"])
    m.nvmlDeviceGetPowerUsage = lambda h: answer("nvmlDeviceGetPowerUsage", h["power"])
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: answer("nvmlDeviceGetEnforcedPowerLimit", h["limit"])
    m.nvmlDeviceGetPerformanceState = lambda h: answer("nvmlDeviceGetPerformanceState", h["pstate"])
    if with_event_reasons:
        m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: answer(
            "nvmlDeviceGetCurrentClocksEventReasons", h["reasons"])
    m.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: answer(
        "nvmlDeviceGetCurrentClocksThrottleReasons", h["reasons"])
    m.nvmlDeviceGetTemperature = lambda h, s: answer("nvmlDeviceGetTemperature", h["temp"])
    m.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: answer("nvmlDeviceGetCurrPcieLinkGeneration", h["gen"])
    m.nvmlDeviceGetCurrPcieLinkWidth = lambda h: answer("nvmlDeviceGetCurrPcieLinkWidth", h["width"])
    m.nvmlDeviceGetUtilizationRates = lambda h: answer(
        "nvmlDeviceGetUtilizationRates", types.SimpleNamespace(gpu=h["util"], memory=0))
    m.nvmlDeviceGetEccMode = lambda h: answer("nvmlDeviceGetEccMode", h["ecc_mode"])
    if cuda_version is not None:
        m.nvmlSystemGetCudaDriverVersion_v2 = lambda: answer("nvmlSystemGetCudaDriverVersion_v2", cuda_version)
        m.nvmlDeviceGetCudaComputeCapability = lambda h: answer(
            "nvmlDeviceGetCudaComputeCapability", h.get("cc", FakeNVMLError(NOT_SUPPORTED_RC)))

    def total_ecc(h, error_type, counter_type):
        ecc = h["ecc"]
        value = ecc if isinstance(ecc, Exception) else ecc[error_type, counter_type]
        return answer("nvmlDeviceGetTotalEccErrors", value)

    m.nvmlDeviceGetTotalEccErrors = total_ecc
    m.nvmlDeviceGetRetiredPages = lambda h, cause: answer("nvmlDeviceGetRetiredPages", h["retired"][cause])
    m.nvmlDeviceGetRetiredPagesPendingStatus = lambda h: answer(
        "nvmlDeviceGetRetiredPagesPendingStatus", h["retired_pending"])
    m.nvmlDeviceGetRemappedRows = lambda h: answer("nvmlDeviceGetRemappedRows", h["remapped"])
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: answer(
        "nvmlDeviceGetComputeRunningProcesses", h["compute_procs"])
    m.nvmlDeviceGetGraphicsRunningProcesses = lambda h: answer(
        "nvmlDeviceGetGraphicsRunningProcesses", h["graphics_procs"])
    return m


def proc(pid: int, used) -> types.SimpleNamespace:
    """One entry of pynvml's process lists (``nvmlFriendlyObject`` has more fields; the probe reads these)."""
    return types.SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)


def uuid_bytes(uuid: str) -> bytes:
    return bytes.fromhex(uuid[len("GPU-"):].replace("-", ""))


class FakeLibcuda:
    """The libcuda.so.1 entry points the probe calls, writing through ctypes pointers like the real ones."""

    def __init__(self, devices: list[dict], driver: int = 13000) -> None:
        self.devices = devices  # CUDA ordinal order: {"uuid", "name", "sm", "cc", "integrated"}
        self.driver = driver
        self.called: list[str] = []

    def cuDriverGetVersion(self, p):
        p.contents.value = self.driver
        return 0

    def cuInit(self, flags):
        self.called.append("cuInit")
        return 0

    def cuDeviceGetCount(self, p):
        p.contents.value = len(self.devices)
        return 0

    def cuDeviceGet(self, p, ordinal):
        p.contents.value = 100 + ordinal  # handles differ from ordinals, as they may
        return 0

    def _dev(self, handle):
        return self.devices[handle - 100]

    def cuDeviceGetName(self, buf, n, handle):
        buf.value = self._dev(handle)["name"].encode()[: n - 1]
        return 0

    def cuDeviceGetUuid_v2(self, buf, handle):
        ctypes.memmove(buf, uuid_bytes(self._dev(handle)["uuid"]), 16)
        return 0

    def cuDeviceGetAttribute(self, p, attr, handle):
        d = self._dev(handle)
        p.contents.value = {16: d["sm"], 75: d["cc"][0], 76: d["cc"][1], 18: int(d["integrated"])}[attr]
        return 0

    def cuCtxCreate(self, *a):  # pragma: no cover - the probe must never call it
        self.called.append("cuCtxCreate")
        return 0

    cuCtxCreate_v2 = cuCtxCreate


UUID_A = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
UUID_B = "GPU-deadbeef-9999-8888-7777-666655554444"


@pytest.fixture
def fake_gpus(monkeypatch, tmp_path):
    """Install a fake pynvml and libcuda; returns a function (nvml_devices, cuda_devices, **kw) -> (nvml, cuda)."""

    def install(nvml_devices, cuda_devices, **kw):
        nvml = make_fake_pynvml(nvml_devices, **kw)
        cuda = FakeLibcuda(cuda_devices)
        monkeypatch.setitem(sys.modules, "pynvml", nvml)
        monkeypatch.setattr(cudadrv, "load_libcuda", lambda: cuda)
        return nvml, cuda

    return install


@pytest.fixture
def meminfo(tmp_path):
    p = tmp_path / "meminfo"
    p.write_text("MemTotal:       131774380 kB\nMemFree:        1000 kB\nMemAvailable:   119212540 kB\n")
    return str(p)


# --- (a) a host with no GPU -----------------------------------------------------------------


@pytest.mark.skipif(HAVE_GPU_LIBS, reason="this host has NVIDIA driver libraries")
def test_no_gpu_host_gives_empty_devices_and_names_missing_libraries():
    r = gpu.read_gpu(timeout_s=20)
    assert r["devices"] == []
    assert "libnvidia-ml.so.1" in r["why"] or "nvidia-ml-py" in r["why"]
    assert "libcuda.so.1" in r["why"]
    assert r["driver_version"] is None and r["cuda_driver_version"] is None
    assert "expect" not in r
    assert isinstance(r["host_meminfo_kb"]["MemTotal"], int) and r["host_meminfo_kb"]["MemTotal"] > 0


def test_module_prints_json():
    p = subprocess.run([sys.executable, "-m", "afddiag.probes.gpu"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert set(r) >= {"driver_version", "cuda_driver_version", "versions", "devices", "host_meminfo_kb", "notes"}
    assert (r["devices"] == []) == ("why" in r)


# --- (b) fake NVML and CUDA -----------------------------------------------------------------


def test_healthy_device_reads_every_field(fake_gpus, meminfo):
    nvml, cuda = fake_gpus(
        [fake_nvml_device(UUID_A)],
        [{"uuid": UUID_A, "name": "NVIDIA H200", "sm": 132, "cc": (9, 0), "integrated": False}],
    )
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    assert "why" not in r, r
    assert r["driver_version"] == "580.159.04"
    assert r["cuda_driver_version"] == 13000
    assert r["versions"]["nvml"] == "13.580.159.04"
    assert r["host_meminfo_kb"] == {"MemTotal": 131774380, "MemFree": 1000, "MemAvailable": 119212540}
    (d,) = r["devices"]
    assert d["index"] == 0 and d["name"] == "NVIDIA H200" and d["uuid"] == UUID_A
    assert d["pci_bus_id"] == "00000000:18:00.0"
    assert d["cuda"] == {"sm_count": 132, "compute_capability": [9, 0], "integrated": False}
    n = d["nvml"]
    assert n["multiprocessor_count"] == "NOT_SUPPORTED"
    assert n["memory_info"] == {"total_bytes": 150754820096, "used_bytes": 500170752, "free_bytes": 150254649344}
    assert (n["clock_sm_mhz"], n["clock_sm_max_mhz"]) == (345, 1980)
    assert (n["power_mw"], n["power_limit_mw"], n["pstate"]) == (75000, 700000, 0)
    assert n["clocks_event_reasons"] == 1 and n["clocks_event_reasons_names"] == ["gpu_idle"]
    assert n["temperature_c"] == 30 and n["pcie"] == {"gen": 5, "width": 16} and n["utilization_pct"] == 0
    assert d["under_load"] is None
    assert "cuCtxCreate" not in cuda.called and cuda.called == ["cuInit"]
    assert nvml.calls.count("nvmlInit") == 1 and nvml.calls.count("nvmlShutdown") == 1
    json.dumps(r)  # plain data only


def test_not_supported_memory_and_failures(fake_gpus, meminfo):
    dev = fake_nvml_device(
        UUID_A, name="NVIDIA GB10",
        mem=FakeNVMLError(NOT_SUPPORTED_RC),  # GB10 unified memory
        limit=FakeNVMLError(NOT_SUPPORTED_RC),
        power=FakeNVMLError(999),  # any other failure: None and a note
        attrs=48,
        reasons=0x24,
    )
    fake_gpus([dev], [{"uuid": UUID_A, "name": "NVIDIA GB10", "sm": 48, "cc": (12, 1), "integrated": True}])
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    (d,) = r["devices"]
    assert d["nvml"]["memory_info"] == "NOT_SUPPORTED"
    assert d["nvml"]["power_limit_mw"] == "NOT_SUPPORTED"
    assert d["nvml"]["power_mw"] is None
    assert any("nvmlDeviceGetPowerUsage" in s and "Unknown Error" in s for s in r["notes"]), r["notes"]
    assert not any("MemoryInfo" in s for s in r["notes"])
    assert d["nvml"]["multiprocessor_count"] == 48
    assert d["nvml"]["clocks_event_reasons_names"] == ["sw_power_cap", "sw_thermal_slowdown"]
    assert d["cuda"]["integrated"] is True and d["cuda"]["compute_capability"] == [12, 1]


def test_join_by_uuid_when_cuda_order_differs(fake_gpus, meminfo):
    # NVML: A then B. CUDA (CUDA_VISIBLE_DEVICES=1,0): B then A, with different SM counts to tell them apart.
    fake_gpus(
        [fake_nvml_device(UUID_A, bus="00000000:18:00.0"), fake_nvml_device(UUID_B, bus="00000000:2A:00.0")],
        [
            {"uuid": UUID_B, "name": "NVIDIA H200", "sm": 132, "cc": (9, 0), "integrated": False},
            {"uuid": UUID_A, "name": "NVIDIA H100", "sm": 114, "cc": (9, 0), "integrated": False},
        ],
    )
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    by_uuid = {d["uuid"]: d for d in r["devices"]}
    assert [d["uuid"] for d in r["devices"]] == [UUID_A, UUID_B]  # NVML order
    assert [d["index"] for d in r["devices"]] == [0, 1]
    assert by_uuid[UUID_A]["cuda"]["sm_count"] == 114
    assert by_uuid[UUID_B]["cuda"]["sm_count"] == 132
    assert by_uuid[UUID_A]["pci_bus_id"] == "00000000:18:00.0"
    assert not any("no CUDA device" in s for s in r["notes"])


def test_device_hidden_from_cuda_is_kept_with_a_note(fake_gpus, meminfo):
    fake_gpus(
        [fake_nvml_device(UUID_A), fake_nvml_device(UUID_B)],
        [{"uuid": UUID_B, "name": "NVIDIA H200", "sm": 132, "cc": (9, 0), "integrated": False}],
    )
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    assert [d["cuda"] for d in r["devices"]][0] is None
    assert r["devices"][1]["cuda"]["sm_count"] == 132
    assert any(UUID_A in s and "no CUDA device" in s for s in r["notes"])


def test_throttle_reasons_fallback_for_old_bindings(fake_gpus, meminfo):
    nvml, _ = fake_gpus([fake_nvml_device(UUID_A, reasons=0x8)],
                        [{"uuid": UUID_A, "name": "x", "sm": 1, "cc": (9, 0), "integrated": False}],
                        with_event_reasons=False)
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    assert r["devices"][0]["nvml"]["clocks_event_reasons"] == 0x8
    assert r["devices"][0]["nvml"]["clocks_event_reasons_names"] == ["hw_slowdown"]
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in nvml.calls


def test_no_libcuda_keeps_nvml_view(fake_gpus, monkeypatch, meminfo):
    fake_gpus([fake_nvml_device(UUID_A)], [])

    def no_lib():
        raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(cudadrv, "load_libcuda", no_lib)
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    assert "why" not in r
    assert r["devices"][0]["cuda"] is None and r["devices"][0]["nvml"]["clock_sm_mhz"] == 345
    assert r["cuda_driver_version"] is None
    assert any("libcuda.so.1" in s for s in r["notes"])


def test_hung_nvml_call_times_out(fake_gpus, meminfo):
    release = threading.Event()
    try:
        fake_gpus([fake_nvml_device(UUID_A)],
                  [{"uuid": UUID_A, "name": "x", "sm": 132, "cc": (9, 0), "integrated": False}],
                  block=release, block_in="nvmlDeviceGetPowerUsage")
        t0 = time.monotonic()
        r = gpu.read_gpu(timeout_s=0.5, meminfo_path=meminfo)
        elapsed = time.monotonic() - t0
        assert elapsed < 3.0
        assert r["why"] == "GPU probe timed out after 0.5s (NVML or CUDA driver call hung)"
        assert r["driver_version"] == "580.159.04"  # what was read before the hang is kept
        assert any("nvmlDeviceGetPowerUsage" in s and "in flight" in s for s in r["notes"]), r["notes"]
        assert r["host_meminfo_kb"]["MemTotal"] == 131774380
    finally:
        release.set()  # let the abandoned worker finish


def test_worker_bug_is_a_note_not_an_exception(fake_gpus, meminfo, monkeypatch):
    fake_gpus([fake_nvml_device(UUID_A)], [])
    monkeypatch.setattr(gpu_nvml, "_nvml_device", lambda run, nv, i: 1 / 0)
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    assert any("ZeroDivisionError" in s for s in r["notes"])
    assert sys.modules["pynvml"].calls.count("nvmlShutdown") == 1


def test_reason_names_and_uuid_format():
    assert gpu_nvml.clocks_event_reason_names(0) == []
    assert gpu_nvml.clocks_event_reason_names(0x1C1) == ["gpu_idle", "hw_thermal_slowdown", "hw_power_brake_slowdown",
                                                    "display_clock_setting"]
    assert gpu_nvml.clocks_event_reason_names(0x800) == ["unknown_0x800"]
    assert gpu_nvml.clocks_event_reason_names("NOT_SUPPORTED") == "NOT_SUPPORTED"
    assert cudadrv.uuid_from_bytes(uuid_bytes(UUID_B)) == UUID_B


# --- (c) health facts: ECC, retired pages, remapped rows, processes -----------------------------

GONE_PID = 2**31 - 2  # above any pid_max: no such process


def test_health_facts_read_every_call(fake_gpus, meminfo):
    dev = fake_nvml_device(
        UUID_A, name="Tesla V100-SXM2-32GB",
        ecc={(0, 0): 3, (1, 0): 0, (0, 1): 17, (1, 1): 1},
        retired={0: [0x1000, 0x2000], 1: [0x3000]},  # page addresses; the probe counts them
        retired_pending=1,
        remapped=(2, 1, 0, 1),
        compute_procs=[proc(os.getpid(), 2147483648), proc(GONE_PID, None)],
        graphics_procs=[proc(GONE_PID, 2**64 - 1)],  # NVML_VALUE_NOT_AVAILABLE
    )
    nvml, _ = fake_gpus([dev], [{"uuid": UUID_A, "name": "x", "sm": 80, "cc": (7, 0), "integrated": False}])
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    n = r["devices"][0]["nvml"]
    assert n["ecc"] == {
        "mode_current": True,
        "volatile": {"corrected": 3, "uncorrected": 0},
        "aggregate": {"corrected": 17, "uncorrected": 1},
    }
    assert n["retired_pages"] == {"single_bit": 2, "double_bit": 1, "pending": True}
    assert n["remapped_rows"] == {"correctable": 2, "uncorrectable": 1, "pending": False, "failure": True}
    me = gpu_nvml.process_name(os.getpid())
    assert isinstance(me, str) and me
    assert n["processes"] == [
        {"pid": os.getpid(), "name": me, "used_bytes": 2147483648, "type": "compute"},
        {"pid": GONE_PID, "name": None, "used_bytes": None, "type": "compute"},
        {"pid": GONE_PID, "name": None, "used_bytes": None, "type": "graphics"},
    ]
    assert nvml.calls.count("nvmlDeviceGetTotalEccErrors") == 4
    assert nvml.calls.count("nvmlDeviceGetRetiredPages") == 2
    assert not any("ecc" in s or "retired" in s or "remapped" in s or "process" in s for s in r["notes"]), r["notes"]
    json.dumps(r)


def test_health_facts_h200_style(fake_gpus, meminfo):
    """Hopper: retired pages N/A (row remapping instead), ECC on, no graphics process list."""
    dev = fake_nvml_device(UUID_A, compute_procs=[proc(GONE_PID, 1 << 30)],
                           graphics_procs=FakeNVMLError(NOT_SUPPORTED_RC))
    fake_gpus([dev], [{"uuid": UUID_A, "name": "x", "sm": 132, "cc": (9, 0), "integrated": False}])
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    n = r["devices"][0]["nvml"]
    assert n["ecc"]["mode_current"] is True
    assert n["ecc"]["volatile"] == n["ecc"]["aggregate"] == {"corrected": 0, "uncorrected": 0}
    assert n["retired_pages"] == "NOT_SUPPORTED"
    assert n["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert n["processes"] == [{"pid": GONE_PID, "name": None, "used_bytes": 1 << 30, "type": "compute"}]
    assert not any("NVML device" in s for s in r["notes"]), r["notes"]


def test_health_facts_not_supported_gb10(fake_gpus, meminfo):
    """GB10 answers N/A for ECC, retired pages and remapped rows: NOT_SUPPORTED, not a fault, no notes."""
    ns = FakeNVMLError(NOT_SUPPORTED_RC)
    dev = fake_nvml_device(UUID_A, name="NVIDIA GB10", mem=ns, ecc_mode=ns, ecc=ns, retired={0: ns, 1: ns},
                           retired_pending=ns, remapped=ns, compute_procs=ns, graphics_procs=ns)
    nvml, _ = fake_gpus([dev], [{"uuid": UUID_A, "name": "x", "sm": 48, "cc": (12, 1), "integrated": True}])
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    n = r["devices"][0]["nvml"]
    assert (n["ecc"], n["retired_pages"], n["remapped_rows"], n["processes"]) == ("NOT_SUPPORTED",) * 4
    assert "nvmlDeviceGetTotalEccErrors" not in nvml.calls  # no counters without ECC
    assert not any("NVML device" in s for s in r["notes"]), r["notes"]


def test_health_facts_other_errors_are_null_with_a_note(fake_gpus, meminfo):
    err = FakeNVMLError(999)
    dev = fake_nvml_device(
        UUID_A,
        ecc={(0, 0): 5, (1, 0): err, (0, 1): FakeNVMLError(NOT_SUPPORTED_RC), (1, 1): 0},
        retired={0: [], 1: err}, retired_pending=0,
        remapped=err,
        compute_procs=err,
    )
    fake_gpus([dev], [{"uuid": UUID_A, "name": "x", "sm": 132, "cc": (9, 0), "integrated": False}])
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    n = r["devices"][0]["nvml"]
    assert n["ecc"] == {"mode_current": True, "volatile": {"corrected": 5, "uncorrected": None},
                        "aggregate": {"corrected": None, "uncorrected": 0}}
    assert n["retired_pages"] == {"single_bit": 0, "double_bit": None, "pending": False}
    assert n["remapped_rows"] == {"correctable": None, "uncorrectable": None, "pending": None, "failure": None}
    assert n["processes"] is None  # a partial list could hide a busy GPU
    notes = "\n".join(r["notes"])
    assert "(volatile uncorrected): nvmlDeviceGetTotalEccErrors failed" in notes
    assert "ecc.aggregate.corrected: NOT_SUPPORTED" in notes
    assert "(double bit): nvmlDeviceGetRetiredPages failed" in notes
    assert "nvmlDeviceGetRemappedRows failed" in notes
    assert "nvmlDeviceGetComputeRunningProcesses failed" in notes and "processes not listed" in notes


def test_health_facts_ecc_mode_off_and_old_bindings(fake_gpus, meminfo):
    nvml, _ = fake_gpus([fake_nvml_device(UUID_A, ecc_mode=[0, 1])],
                        [{"uuid": UUID_A, "name": "x", "sm": 132, "cc": (9, 0), "integrated": False}])
    del nvml.nvmlDeviceGetRemappedRows  # bindings older than the call
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    n = r["devices"][0]["nvml"]
    assert n["ecc"]["mode_current"] is False
    assert n["remapped_rows"]["correctable"] is None
    assert any("nvmlDeviceGetRemappedRows failed: AttributeError" in s for s in r["notes"])


# --- (d) Xid events from the kernel log -------------------------------------------------------

# Realistic kernel log lines: /dev/kmsg records (prio,seq,ts_us,flags;message + continuation lines),
# dmesg and journalctl forms, and NVRM lines that are not Xids.
XID_LINES = [
    "4,1826,94727312,-;NVRM: Xid (PCI:0000:01:00): 79, pid=2291, name=python3, GPU has fallen off the bus.\n"
    " SUBSYSTEM=pci\n DEVICE=+pci:0000:01:00.0\n",
    "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double "
    "bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
    "Nov 30 12:03:06 node7 kernel: NVRM: Xid (0000:af:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): "
    "Out Of Range Address",
    "6,1830,94727400,-;NVRM: Xid (PCI:0008:01:00 GPU-I:01): 13, pid=4410, name=vllm, Graphics Exception: "
    "ESR 0x50da30=0x10 0x50da34=0x0",
    "4,1700,90000000,-;NVRM: GPU at PCI:0000:01:00: GPU-7cd2085c-0491-8f33-d0c7-9a185274e8bc",
    "6,1701,90000100,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.159.04",
    "[ 2345.1] pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
    "4,1702,90000200,-;NVRM: Xid (PCI:0000:01:00): bogus",  # no number: not an event
]


def test_parse_xid_lines():
    assert xid.parse_xid_lines(XID_LINES) == [
        {"xid": 79, "pci": "0000:01:00", "boots_ago": 0,
         "text": "NVRM: Xid (PCI:0000:01:00): 79, pid=2291, name=python3, GPU has fallen off the bus."},
        {"xid": 48, "pci": "0000:3b:00", "boots_ago": 0,
         "text": "NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit "
                 "error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0."},
        {"xid": 13, "pci": "0000:af:00", "boots_ago": 0,
         "text": "NVRM: Xid (0000:af:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): "
                 "Out Of Range Address"},
        {"xid": 13, "pci": "0008:01:00", "boots_ago": 0,
         "text": "NVRM: Xid (PCI:0008:01:00 GPU-I:01): 13, pid=4410, name=vllm, Graphics Exception: "
                 "ESR 0x50da30=0x10 0x50da34=0x0"},
    ]
    assert xid.parse_xid_lines([]) == []
    assert xid.parse_xid_lines(["NVRM: Xid (no address here): 31, pid=1, MMU Fault"]) == [
        {"xid": 31, "pci": None, "boots_ago": 0, "text": "NVRM: Xid (no address here): 31, pid=1, MMU Fault"}]


def test_xid_events_from_a_kmsg_like_pipe(fake_gpus, meminfo):
    """/dev/kmsg hands one record per read and EAGAIN at the end; a pipe with its writer open does the same."""
    fake_gpus([fake_nvml_device(UUID_A)], [{"uuid": UUID_A, "name": "x", "sm": 132, "cc": (9, 0), "integrated": False}])
    rfd, wfd = os.pipe()
    try:
        for rec in (XID_LINES[0], XID_LINES[4] + "\n", XID_LINES[3] + "\n"):
            os.write(wfd, rec.encode())
        path = f"/proc/self/fd/{rfd}"
        t0 = time.monotonic()
        r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo, kmsg_path=path)
        assert time.monotonic() - t0 < 3.0  # EAGAIN ended the read: nothing waited for the writer
    finally:
        os.close(wfd)
        os.close(rfd)
    assert r["xid_source"] == path
    assert [(e["xid"], e["pci"]) for e in r["xid_events"]] == [(79, "0000:01:00"), (13, "0008:01:00")]
    assert not any(s.startswith("xid") for s in r["notes"]), r["notes"]


def test_kmsg_missing_says_why(fake_gpus, meminfo, tmp_path):
    fake_gpus([fake_nvml_device(UUID_A)], [{"uuid": UUID_A, "name": "x", "sm": 132, "cc": (9, 0), "integrated": False}])
    missing = str(tmp_path / "no-kmsg")
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo, kmsg_path=missing)
    assert r["xid_events"] is None
    assert r["xid_source"] == f"not readable: {missing}: No such file or directory"
    assert "why" not in r and r["devices"][0]["nvml"]["clock_sm_mhz"] == 345  # the rest is read as usual


def test_kmsg_permission_denied_says_run_as_root(fake_gpus, meminfo, monkeypatch):
    fake_gpus([fake_nvml_device(UUID_A)], [{"uuid": UUID_A, "name": "x", "sm": 132, "cc": (9, 0), "integrated": False}])
    real_open = os.open

    def deny_kmsg(path, flags, *a):  # root reads /dev/kmsg whatever its mode: deny it here
        if path == "/dev/kmsg":
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *a)

    monkeypatch.setattr(xid.os, "open", deny_kmsg)
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    assert r["xid_events"] is None
    assert r["xid_source"] == "not readable: /dev/kmsg: Permission denied (run as root or give --xid-log)"

    def eperm(path, flags, *a):  # dmesg_restrict=1 answers EPERM
        raise PermissionError(errno.EPERM, "Operation not permitted", path)

    monkeypatch.setattr(xid.os, "open", eperm)
    assert xid.read_xid_events()[:2] == (
        None, "not readable: /dev/kmsg: Operation not permitted (run as root or give --xid-log)")


JOURNAL_TWO_BOOTS = [  # `journalctl -k -b all` style: an Xid 79 before the reboot, an Xid 13 after it
    "-- Boot 5b0f3c6a2d7e4f1a9c8b7d6e5f4a3b2c --",
    "Nov 30 12:03:06 spark-a kernel: NVRM: Xid (PCI:000f:01:00): 79, pid=2291, name=vllm, GPU has fallen off the bus.",
    "-- Boot 0e1d2c3b4a5f60718293a4b5c6d7e8f9 --",
    "Dec 01 08:00:00 spark-a kernel: Linux version 6.11.0-1016-nvidia (buildd@lcy02) #16-Ubuntu SMP",
    "Dec 01 09:10:11 spark-a kernel: NVRM: Xid (PCI:000f:01:00): 13, pid=3001, name=python3, Graphics Exception",
]


@pytest.mark.parametrize("lines, want", [
    (JOURNAL_TWO_BOOTS, [(79, 1), (13, 0)]),
    # dmesg saved across a reboot: the timestamps start again
    (["[ 8123.4] NVRM: Xid (PCI:0000:01:00): 79, pid=1, GPU has fallen off the bus.",
      "[    0.000000] Booting Linux on physical CPU 0x0000000000 [0x410fd4c1]",
      "[  912.5] NVRM: Xid (PCI:0000:01:00): 31, pid=2, MMU Fault"], [(79, 1), (31, 0)]),
    # a log that ends with a boot after its last Xid: that Xid is from an earlier boot too
    (JOURNAL_TWO_BOOTS[:2] + ["-- Reboot --"], [(79, 1)]),
])
def test_xid_events_know_their_boot(lines, want):
    events = xid.parse_xid_lines(lines)
    assert [(e["xid"], e["boots_ago"]) for e in events] == want
    # a capture writes them back with the boots marked, and a replay reads the same boots back
    assert [(e["xid"], e["boots_ago"]) for e in xid.parse_xid_lines(xid.boots_text(events).splitlines())] == want


def test_a_saved_dmesg_older_than_this_boot_is_an_earlier_boot(fake_gpus, meminfo, tmp_path, monkeypatch):
    """--xid-log with a dmesg saved before the last reboot: its timestamps pass this boot's uptime."""
    log = tmp_path / "dmesg-before-reboot.txt"
    log.write_text("[ 8123.4] NVRM: Xid (PCI:0000:01:00): 79, pid=1, GPU has fallen off the bus.\n")
    fake_gpus([fake_nvml_device(UUID_A)], [{"uuid": UUID_A, "name": "x", "sm": 132, "cc": (9, 0), "integrated": False}])
    monkeypatch.setattr(gpu, "read_uptime_s", lambda: 600.0)  # up ten minutes: that line is from before
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo, kmsg_path="/nonexistent/kmsg", xid_log=str(log))
    assert [(e["xid"], e["boots_ago"]) for e in r["xid_events"]] == [(79, 1)]
    monkeypatch.setattr(gpu, "read_uptime_s", lambda: 9000.0)  # up long enough: this boot's
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo, kmsg_path="/nonexistent/kmsg", xid_log=str(log))
    assert [(e["xid"], e["boots_ago"]) for e in r["xid_events"]] == [(79, 0)]


def test_xid_log_file_is_read_instead_of_kmsg_and_bounded(fake_gpus, meminfo, tmp_path):
    fake_gpus([fake_nvml_device(UUID_A)], [{"uuid": UUID_A, "name": "x", "sm": 132, "cc": (9, 0), "integrated": False}])
    log = tmp_path / "dmesg.txt"
    log.write_text("\n".join(XID_LINES[1:3]) + "\n")
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo, kmsg_path="/nonexistent/kmsg", xid_log=str(log))
    assert r["xid_source"] == str(log)
    assert [e["xid"] for e in r["xid_events"]] == [48, 13]

    # a log larger than the limit: its last max_bytes are read, the cut first line dropped
    filler = "[   1.0] usb 1-1: new high-speed USB device number 2 using xhci_hcd\n" * 2000
    log.write_text(XID_LINES[1] + "\n" + filler + XID_LINES[2] + "\n")
    events, source, notes = xid.read_xid_events(str(log), max_bytes=4096)
    assert source == str(log) and [e["xid"] for e in events] == [13]
    assert any("read its last 4096" in s for s in notes)

    # the time bound
    events, source, notes = xid.read_xid_events(str(log), deadline=time.monotonic() - 1)
    assert events == [] and any("time bound" in s for s in notes)

    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo, xid_log=str(tmp_path / "gone.txt"))
    assert r["xid_events"] is None and r["xid_source"].startswith("not readable: ")
    assert "--xid-log" not in r["xid_source"]


# --- a real GPU (the device machine) --------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU_LIBS, reason="no NVIDIA driver libraries on this host")
def test_real_gpu_reads():
    r = gpu.read_gpu(timeout_s=30)
    assert "why" not in r, r
    assert r["devices"], r
    assert isinstance(r["driver_version"], str) and isinstance(r["cuda_driver_version"], int)
    for d in r["devices"]:
        assert d["uuid"].startswith("GPU-")
        assert d["cuda"]["sm_count"] > 0
        assert len(d["cuda"]["compute_capability"]) == 2
        assert d["nvml"]["clock_sm_max_mhz"] > 0
        n = d["nvml"]
        assert n["ecc"] == "NOT_SUPPORTED" or isinstance(n["ecc"]["mode_current"], bool)
        assert n["retired_pages"] == "NOT_SUPPORTED" or set(n["retired_pages"]) == {
            "single_bit", "double_bit", "pending"}
        assert n["remapped_rows"] == "NOT_SUPPORTED" or isinstance(n["remapped_rows"]["uncorrectable"], int)
        assert n["processes"] == "NOT_SUPPORTED" or isinstance(n["processes"], list)
    assert isinstance(r["xid_source"], str)
    assert (r["xid_events"] is None) == r["xid_source"].startswith("not readable")


def _shape(v):
    """Nested key structure of a JSON value (dict keys; the first element of lists)."""
    if isinstance(v, dict):
        return {k: _shape(x) for k, x in v.items()}
    if isinstance(v, list) and v and isinstance(v[0], dict):
        return [_shape(v[0])]
    return None


def _key_paths(v, prefix=""):
    """Every key path of a JSON value (``devices[].nvml.ecc.volatile.corrected``, ...)."""
    out = set()
    if isinstance(v, dict):
        for k, x in v.items():
            out.add(prefix + k)
            out |= _key_paths(x, prefix + k + ".")
    elif isinstance(v, list):
        for x in v:
            out |= _key_paths(x, prefix.rstrip(".") + "[].")
    return out


def test_recorded_h200_fixtures_have_the_probes_shape(fake_gpus, meminfo):
    """The h200-live-* fixtures are read_gpu output: busy has every key the probe gives now (a fake
    answering as the H200 did); idle and load, recorded before the health facts, have a subset."""
    from pathlib import Path

    fixtures = Path(__file__).parent / "fixtures" / "gpu"
    fake_gpus([fake_nvml_device(UUID_A, compute_procs=[proc(os.getpid(), 2 << 30)])],
              [{"uuid": UUID_A, "name": "x", "sm": 132, "cc": (9, 0), "integrated": False}])
    now = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)

    busy = json.loads((fixtures / "h200-live-busy" / "gpu.json").read_text())
    # meminfo lines added after the recording (gpu.headroom, the CMA signature) are the only new keys
    added = set(now["host_meminfo_kb"]) - set(busy["host_meminfo_kb"])
    assert added == {"MemFree"} and added <= set(gpu.MEMINFO_KEYS)  # the fake meminfo has MemFree, no Cached
    now["host_meminfo_kb"] = {k: v for k, v in now["host_meminfo_kb"].items() if k not in added}
    # per-part wall times, added after the recording (issue 16): NVML, CUDA and the kernel log
    assert set(now.pop("timings_ms")) == {"nvml_ms", "cuda_ms", "xid_ms"}
    # keys added after that recording (issue 12: who probed, and the CUDA ordinal for the busy check;
    # issue 16: whether CUDA was read and why, NVML's compute capability)
    assert _key_paths(now) - _key_paths(busy) == {"probe_pid", "devices[].cuda_ordinal", "cuda_view",
                                                  "cuda_view.read", "cuda_view.why",
                                                  "devices[].nvml.compute_capability"}
    now.pop("probe_pid")
    assert now.pop("cuda_view") == {"read": True, "why": None}
    for d in now["devices"]:
        d.pop("cuda_ordinal")
        d["nvml"].pop("compute_capability")
    assert _shape(now) == _shape(busy)
    n = busy["devices"][0]["nvml"]
    assert n["ecc"]["mode_current"] is True and n["retired_pages"] == "NOT_SUPPORTED"
    assert isinstance(n["remapped_rows"]["uncorrectable"], int)
    assert [(p["type"], p["name"]) for p in n["processes"]] == [("compute", "python3")]
    assert n["processes"][0]["used_bytes"] >= 2 << 30
    assert busy["xid_source"] == "/dev/kmsg" and isinstance(busy["xid_events"], list)

    recorded = json.loads((fixtures / "h200-live-idle" / "gpu.json").read_text())
    assert _key_paths(recorded) <= _key_paths(now)
    assert _key_paths(now) - _key_paths(recorded) == _key_paths(busy) - _key_paths(recorded)
    assert recorded["devices"][0]["cuda"]["sm_count"] == 132

    loaded = json.loads((fixtures / "h200-live-load" / "gpu.json").read_text())
    ul = loaded["devices"][0]["under_load"]
    assert set(ul) >= {"clock_sm_mhz", "power_mw", "utilization_pct", "clocks_event_reasons", "pstate", "achieved"}
    assert loaded["expect"]["image_sm_count"] == 132
    assert loaded["expect"]["baseline"]["bf16_tflops"] == ul["achieved"]["bf16_tflops"]


def test_nvml_and_cuda_are_read_at_once(fake_gpus, meminfo):
    """cuInit dominates on a discrete GPU (issue 16): NVML must not wait for it. Here NVML's power
    read waits until cuInit has been called; read one after the other, the probe would time out."""
    cu_started = threading.Event()
    _, cuda = fake_gpus([fake_nvml_device(UUID_A)],
                        [{"uuid": UUID_A, "name": "x", "sm": 132, "cc": (9, 0), "integrated": False}],
                        block=cu_started, block_in="nvmlDeviceGetPowerUsage")
    real_init = cuda.cuInit

    def slow_init(flags):
        cu_started.set()
        time.sleep(0.3)  # a slow driver initialisation
        return real_init(flags)

    cuda.cuInit = slow_init
    t0 = time.monotonic()
    r = gpu.read_gpu(timeout_s=2.0, meminfo_path=meminfo)
    assert "failed" not in r, r.get("failed")
    assert r["devices"][0]["cuda"]["sm_count"] == 132 and r["devices"][0]["nvml"]["power_mw"] is not None
    assert time.monotonic() - t0 < 1.5
    assert r["timings_ms"]["cuda_ms"] >= 300 and set(r["timings_ms"]) == {"nvml_ms", "cuda_ms", "xid_ms"}


def test_preinit_starts_cuinit_once_in_the_background(fake_gpus, meminfo, monkeypatch):
    _, cuda = fake_gpus([fake_nvml_device(UUID_A)],
                        [{"uuid": UUID_A, "name": "x", "sm": 132, "cc": (9, 0), "integrated": False}])
    monkeypatch.setattr(gpu, "_PREINIT", [])
    inits = []
    real_init = cuda.cuInit
    gate = threading.Event()

    def slow_init(flags):
        inits.append(flags)
        gate.wait(5)
        return real_init(flags)

    cuda.cuInit = slow_init
    t0 = time.monotonic()
    gpu.preinit_cuda()
    gpu.preinit_cuda()
    assert time.monotonic() - t0 < 0.5  # returns at once, cuInit still running
    gate.set()
    gpu._PREINIT[0].join(5)
    assert inits == [0] and len(gpu._PREINIT) == 1
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    assert r["devices"][0]["cuda"]["sm_count"] == 132


# --- (c) CUDA only when the run needs it (issue 16: cuInit is 0.2 s of a 0.46 s `afddiag gpu` on an H200) ---


class CountingLibcuda(FakeLibcuda):
    """A fake libcuda that counts how often it was loaded (the seam ``cudadrv.load_libcuda``)."""

    loads = 0


@pytest.fixture
def counted_gpus(fake_gpus, monkeypatch):
    """A fake H200 (NVML with the CUDA facts it answers, libcuda counting loads); returns the libcuda."""
    nvml = make_fake_pynvml([fake_nvml_device(UUID_A, cc=(9, 0))], cuda_version=13000)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    cuda = CountingLibcuda([{"uuid": UUID_A, "name": "NVIDIA H200", "sm": 132, "cc": (9, 0), "integrated": False}])

    def load():
        cuda.loads += 1
        return cuda

    monkeypatch.setattr(cudadrv, "load_libcuda", load)
    monkeypatch.setattr(gpu, "_PREINIT", [])
    return cuda


def test_nvml_only_read_leaves_the_cuda_driver_alone(counted_gpus, meminfo):
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo, cuda=False, cuda_why="not needed here")
    assert counted_gpus.loads == 0 and counted_gpus.called == []
    assert r["cuda_view"] == {"read": False, "why": "not needed here"}
    (d,) = r["devices"]
    assert d["cuda"] is None and d["cuda_ordinal"] is None
    assert d["nvml"]["compute_capability"] == [9, 0]
    assert r["cuda_driver_version"] == 13000  # nvmlSystemGetCudaDriverVersion_v2
    assert "cuda_ms" not in r["timings_ms"]
    assert not any("CUDA" in n for n in r["notes"]), r["notes"]  # not reading CUDA is no fault
    from afddiag.model.gpu import gpu_facts_from_readings

    f = gpu_facts_from_readings(r)
    assert f.devices[0].compute_capability == (9, 0) and f.devices[0].sm_count is None
    assert f.devices[0].memory_source == "nvml" and not f.devices[0].unified
    assert f.cuda_view == {"read": False, "why": "not needed here"}


def _gpu_run(**kw):
    from afddiag.model.run import Inputs
    from afddiag.probes.registry import Sources
    from afddiag.runner import diagnose

    inputs = Inputs(families=frozenset({"gpu"}), xid_log=os.devnull, **kw)
    rep, obs = diagnose(inputs, host=Sources.live(cpu=None, memreg=None, pcie=None, route=None))
    return {v["id"]: v for v in rep["gates"]}, obs


def test_gpu_run_without_an_expected_sm_count_never_initialises_cuda(counted_gpus):
    verdicts, obs = _gpu_run()
    assert counted_gpus.loads == 0 and "cuInit" not in counted_gpus.called
    assert obs.gpu.cuda_view["read"] is False and "nothing in this run needs it" in obs.gpu.cuda_view["why"]
    assert verdicts["gpu.present"]["verdict"] == "PASS"
    assert "(cc 9.0)" in verdicts["gpu.present"]["summary"]  # no "? SMs": the SM count was not asked, not unread
    assert verdicts["gpu.sm-count"]["verdict"] == "SKIP"  # no expectation: as before
    assert obs.gpu.devices[0].compute_capability == (9, 0)  # NVML's view feeds the arch gate


@pytest.mark.parametrize("kw, source", [
    ({"expect_sm": 132}, "--expect-sm"),
    ({"launch_env": {"AFD_IMAGE_SM_COUNT": "132"}, "launch_env_path": "rank.env"}, "AFD_IMAGE_SM_COUNT in rank.env"),
])
def test_gpu_run_with_an_expected_sm_count_reads_cuda(counted_gpus, kw, source):
    verdicts, obs = _gpu_run(**kw)
    assert counted_gpus.loads >= 1 and counted_gpus.called.count("cuInit") == 1
    assert obs.gpu.cuda_view == {"read": True, "why": f"expected SM count 132 ({source})"}
    assert obs.gpu.devices[0].sm_count == 132
    assert "(132 SMs, cc 9.0)" in verdicts["gpu.present"]["summary"]
    assert verdicts["gpu.sm-count"]["verdict"] == "PASS"


def test_cuda_reason_names_every_need():
    from afddiag.model.host import ImageFacts
    from afddiag.model.run import Inputs, Observation
    from afddiag.probes.gpu import cuda_reason

    gpu_only = frozenset({"gpu"})
    assert cuda_reason(Inputs(families=gpu_only)) is None
    assert cuda_reason(Inputs(families=gpu_only, run_qp=False)) is None
    assert "capture" in cuda_reason(Inputs(families=gpu_only), capturing=True)
    assert cuda_reason(Inputs(families=gpu_only, load=True)) == "the load probe runs"
    assert "dma-buf" in cuda_reason(Inputs())  # `all`: the memory-registration probe initialises CUDA anyway
    assert cuda_reason(Inputs(run_qp=False, families=frozenset({"fabric", "gpu"}))) is None
    obs = Observation(host="h", source="live")
    obs.image = ImageFacts(ref="img:1", labels={"afd.export.sm_count": "132"})
    assert "label afd.export.sm_count" in cuda_reason(Inputs(families=gpu_only), obs)


def test_cli_gpu_starts_cuinit_only_when_needed(counted_gpus, monkeypatch):
    from click.testing import CliRunner

    from afddiag.cli import cli

    monkeypatch.setenv("AFDDIAG_HISTORY", os.devnull)
    started = []
    monkeypatch.setattr(gpu, "preinit_cuda", lambda: started.append(1))
    res = CliRunner().invoke(cli, ["gpu", "--json", "--no-history", "--xid-log", os.devnull])
    assert res.exit_code in (0, 1), res.output
    assert started == [] and counted_gpus.loads == 0
    assert json.loads(res.stdout)["facts"]["gpu"]["cuda_view"]["read"] is False
    res = CliRunner().invoke(cli, ["gpu", "--json", "--no-history", "--xid-log", os.devnull, "--expect-sm", "132"])
    assert started == [1] and counted_gpus.called.count("cuInit") == 1
    assert {v["id"]: v["verdict"] for v in json.loads(res.stdout)["gates"]}["gpu.sm-count"] == "PASS"
