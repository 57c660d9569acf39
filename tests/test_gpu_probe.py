"""The live GPU probe (afddiag.probes.gpu) against fake NVML/CUDA, and on whatever host runs it."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import threading
import time
import types

import pytest

from afddiag.probes import gpu

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
    }
    d.update(over)
    return d


def make_fake_pynvml(devices: list[dict], block: threading.Event | None = None, block_in: str = "",
                     with_event_reasons: bool = True) -> types.ModuleType:
    """A module with pynvml's names; ``block_in`` names a call that waits on ``block`` forever."""
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED_RC
    m.NVML_ERROR_LIBRARY_NOT_FOUND = 12
    m.NVML_CLOCK_SM = 1
    m.NVML_TEMPERATURE_GPU = 0
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
    return m


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
        monkeypatch.setattr(gpu, "_load_libcuda", lambda: cuda)
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
    assert r["host_meminfo_kb"] == {"MemTotal": 131774380, "MemAvailable": 119212540}
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

    monkeypatch.setattr(gpu, "_load_libcuda", no_lib)
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
    monkeypatch.setattr(gpu, "_nvml_device", lambda run, nv, i: 1 / 0)
    r = gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)
    assert any("ZeroDivisionError" in s for s in r["notes"])
    assert sys.modules["pynvml"].calls.count("nvmlShutdown") == 1


def test_reason_names_and_uuid_format():
    assert gpu.clocks_event_reason_names(0) == []
    assert gpu.clocks_event_reason_names(0x1C1) == ["gpu_idle", "hw_thermal_slowdown", "hw_power_brake_slowdown",
                                                    "display_clock_setting"]
    assert gpu.clocks_event_reason_names(0x800) == ["unknown_0x800"]
    assert gpu.clocks_event_reason_names("NOT_SUPPORTED") == "NOT_SUPPORTED"
    assert gpu.uuid_from_bytes(uuid_bytes(UUID_B)) == UUID_B


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


def _shape(v):
    """Nested key structure of a JSON value (dict keys; the first element of lists)."""
    if isinstance(v, dict):
        return {k: _shape(x) for k, x in v.items()}
    if isinstance(v, list) and v and isinstance(v[0], dict):
        return [_shape(v[0])]
    return None


def test_recorded_h200_fixture_has_the_probes_shape(fake_gpus, meminfo):
    """tests/fixtures/gpu/h200-live-idle is read_gpu output: same keys as the probe produces now."""
    from pathlib import Path

    fixtures = Path(__file__).parent / "fixtures" / "gpu"
    recorded = json.loads((fixtures / "h200-live-idle" / "gpu.json").read_text())
    fake_gpus([fake_nvml_device(UUID_A)], [{"uuid": UUID_A, "name": "x", "sm": 132, "cc": (9, 0), "integrated": False}])
    assert _shape(gpu.read_gpu(timeout_s=5, meminfo_path=meminfo)) == _shape(recorded)
    assert recorded["devices"][0]["cuda"]["sm_count"] == 132

    loaded = json.loads((fixtures / "h200-live-load" / "gpu.json").read_text())
    ul = loaded["devices"][0]["under_load"]
    assert set(ul) >= {"clock_sm_mhz", "power_mw", "utilization_pct", "clocks_event_reasons", "pstate", "achieved"}
    assert loaded["expect"]["image_sm_count"] == 132
    assert loaded["expect"]["baseline"]["bf16_tflops"] == ul["achieved"]["bf16_tflops"]
