#!/usr/bin/env python3
# Device time between two events around one tiny kernel, by what precedes
# the start event (a D2D memcpy, a kernel, nothing), queued behind a gate.
import statistics, torch
torch.cuda.set_device(0)
s = torch.cuda.Stream(); torch.cuda.set_stream(s)
x = torch.ones(4, dtype=torch.bfloat16, device="cuda")
fresh = torch.ones_like(x)
big = torch.ones(1 << 20, dtype=torch.bfloat16, device="cuda")
bigf = torch.ones_like(big)
def run(prep, body=lambda: x.add_(1), n=300):
    torch.cuda.synchronize()
    torch.cuda._sleep(40_000_000)
    evs = []
    for _ in range(n):
        prep()
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); body(); b.record(); evs.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) * 1e3 for a, b in evs[30:])
for rep in range(2):
    print(f"rep {rep}: memcpy-prep {run(lambda: x.copy_(fresh)):.2f}  kernel-prep {run(lambda: x.fill_(1)):.2f}"
          f"  no-prep {run(lambda: None):.2f}  2MiB-memcpy-prep {run(lambda: big.copy_(bigf)):.2f}"
          f"  2MiB-kernel-prep {run(lambda: big.mul_(1)):.2f}  empty-body {run(lambda: None, body=lambda: None):.2f}")
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g, stream=s):
    for _ in range(20): x.add_(1)
torch.cuda.synchronize()
reps = []
for _ in range(50):
    a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
    a.record(); g.replay(); b.record(); reps.append((a, b))
torch.cuda.synchronize()
print(f"graph per kernel {statistics.median(a.elapsed_time(b) * 1e3 / 20 for a, b in reps[5:]):.2f}")
