"""A competing GPU job for the busy-GPU recordings (issue 12): torch bf16 8192^3 matmuls back to back
for argv[1] seconds; prints "running" once started and its average TFLOP/s every ~5 s."""
import sys
import time

import torch

n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print("running", flush=True)
t0 = last = time.time()
done = 0
while time.time() - t0 < float(sys.argv[1]):
    for _ in range(20):
        torch.mm(a, b)
    torch.cuda.synchronize()
    done += 20
    if time.time() - last > 5:
        tflops = 2 * n ** 3 * done / (time.time() - t0) / 1e12
        print(f"{time.time() - t0:6.1f} s: {tflops:.0f} TFLOP/s average", flush=True)
        last = time.time()
print(f"stopped after {time.time() - t0:.1f} s, {done} matmuls", flush=True)
