#!/usr/bin/env bash
# Issue 15 on an H200 machine: the CUDA side of memory registration (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
# ..._DMA_BUF_SUPPORTED, a dma-buf export of a cuMemAlloc buffer, the driver flavour, nvidia_peermem), the
# headroom readings (/proc/meminfo, NVML free memory) and the PCIe / netdev link readings the new gates judge.
# Run from the repo root: OUT=/some/dir bash benchmarks/h200/issue15.sh  (stdlib + click + rich + pynvml +
# psutil; nothing installed). Writes $OUT/issue15/*.json and *.txt; every step bounded, about 1 minute in all.
set -u
OUT="${OUT:?set OUT to the folder to write into}"
D="$OUT/issue15"
mkdir -p "$D"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export AFDDIAG_STATE_DIR="$D/state"
PY="${PYTHON:-python3}"
step() {  # step NAME SECONDS CMD...: stdout to NAME, stderr and the exit code to NAME.err
  local name="$1" t="$2"; shift 2
  timeout "$t" "$@" >"$D/$name" 2>"$D/$name.err"
  echo "rc=$?" >>"$D/$name.err"
}
# the memory-registration readings: CUDA attributes, the dma-buf export, verbs MRs where RDMA devices exist
step memreg.json 60 "$PY" -m afddiag.probes.memreg --count 64 --timeout 20
# the same with the CUDA side only (no pyverbs needed: what the export alone does)
step memreg-cuda.json 30 "$PY" -m afddiag.probes.memreg --no-verbs
# GPU readings as gpu.json (headroom: NVML free memory, host_meminfo_kb with MemFree/Cached/Cma*)
step gpu.json 30 "$PY" -m afddiag.probes.gpu
# the gates on this host in the coordinator role (gpu.headroom, gpu.memory, launch.memory-plan with a launch env,
# fabric.mem-registration and host.pcie; without --no-qp, which would skip the registration probe)
printf 'AFD_FABRIC_IP=192.0.2.10\nAFD_PREFILL_CAPACITY=1024\nAFD_DRAFTER=1\n' >"$D/coord.env"
step gpu-coordinator.json 90 "$PY" -m afddiag all --json --no-history --role coordinator --launch-env "$D/coord.env"
# the raw sources, for fixtures
step pcie.json 20 "$PY" -m afddiag.probes.pcie
step meminfo.txt 5 grep -E '^(MemTotal|MemFree|MemAvailable|Buffers|Cached|CmaTotal|CmaFree):' /proc/meminfo
step nvidia-version.txt 5 cat /proc/driver/nvidia/version
step nvidia-smi-memory.txt 20 nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,memory.free,memory.used --format=csv
# PCIe link of every NVIDIA and Mellanox function, and every netdev's speed (host.pcie / fabric.link-speed)
step links.json 20 "$PY" - <<'PYEOF'
import json, os
out = {"pci": {}, "net": {}}
base = "/sys/bus/pci/devices"
for bdf in sorted(os.listdir(base)):
    p = os.path.join(base, bdf)
    try:
        vendor = open(os.path.join(p, "vendor")).read().strip()
    except OSError:
        continue
    if vendor not in ("0x10de", "0x15b3"):
        continue
    rec = {"vendor": vendor}
    for a in ("device", "class", "current_link_speed", "current_link_width", "max_link_speed", "max_link_width"):
        try:
            rec[a] = open(os.path.join(p, a)).read().strip()
        except OSError as e:
            rec[a] = None
            rec.setdefault("errors", {})[a] = e.strerror
    try:
        rec["driver"] = os.path.basename(os.readlink(os.path.join(p, "driver")))
    except OSError:
        rec["driver"] = None
    out["pci"][bdf] = rec
for n in sorted(os.listdir("/sys/class/net")):
    rec = {}
    for a in ("speed", "operstate", "mtu"):
        try:
            rec[a] = open(f"/sys/class/net/{n}/{a}").read().strip()
        except OSError as e:
            rec[a] = None
            rec.setdefault("errors", {})[a] = e.strerror
    try:
        rec["device"] = os.path.basename(os.readlink(f"/sys/class/net/{n}/device"))
    except OSError:
        rec["device"] = None
    out["net"][n] = rec
ib = "/sys/class/infiniband"
out["infiniband"] = {}
if os.path.isdir(ib):
    for n in sorted(os.listdir(ib)):
        try:
            out["infiniband"][n] = os.path.basename(os.readlink(os.path.join(ib, n, "device")))
        except OSError:
            out["infiniband"][n] = None
print(json.dumps(out, indent=2))
PYEOF
# a one-line summary per file, with units
"$PY" - "$D" <<'PYEOF' >"$D/summary.txt" 2>&1
import json, sys, os
d = sys.argv[1]
def load(n):
    try:
        return json.load(open(os.path.join(d, n)))
    except Exception as e:
        return {"unreadable": str(e)}
m = load("memreg.json")
cu = m.get("cuda") or {}
for g in cu.get("devices", []):
    print(f"GPU {g.get('ordinal')} {g.get('name')}: GPUDirect RDMA supported {g.get('gpu_direct_rdma_supported')}, "
          f"dma-buf supported {g.get('dma_buf_supported')}, integrated {g.get('integrated')}")
ex = cu.get("dmabuf_export")
if ex:
    print(f"dma-buf export of {ex.get('bytes', 0) / 2**20:.0f} MiB on GPU {ex.get('ordinal')}: ok={ex.get('ok')} error={ex.get('error')}")
drv = m.get("driver") or {}
print(f"driver open kernel module {drv.get('open_kernel_module')}, nvidia_peermem loaded {drv.get('peermem_loaded')}")
for v in (m.get("verbs") or {}).get("devices", []):
    c = v.get("host_mr_count") or {}
    print(f"{v.get('name')}: host MR {v.get('host_mr')}, {c.get('registered')} of {c.get('wanted')} x 1 MiB held, "
          f"dma-buf MR {v.get('dmabuf_mr')}")
print("verbs:", (m.get("verbs") or {}).get("why", "ran"))
g = load("gpu.json")
mi = g.get("host_meminfo_kb") or {}
print("meminfo: " + ", ".join(f"{k} {v / 2**20:.1f} GiB" for k, v in mi.items() if isinstance(v, int)))
for dv in g.get("devices", []):
    mem = (dv.get("nvml") or {}).get("memory_info")
    if isinstance(mem, dict):
        print(f"GPU {dv.get('index')}: NVML free {mem.get('free_bytes', 0) / 2**30:.2f} GiB of {mem.get('total_bytes', 0) / 2**30:.2f} GiB")
rep = load("gpu-coordinator.json")
for gate in rep.get("gates", []):
    if gate["id"] in ("gpu.headroom", "gpu.memory", "launch.memory-plan", "fabric.mem-registration", "host.pcie"):
        print(f"{gate['id']}: {gate['verdict']}: {gate['summary']}")
PYEOF
cat "$D/summary.txt"
