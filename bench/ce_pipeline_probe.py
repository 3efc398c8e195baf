#!/usr/bin/env python3
"""How fast a two-rank all-reduce can be when copy engines move the bytes
and stream memory operations order them (no kernel waits on a flag).

One process drives cuda:0 and cuda:1 as ranks 0 and 1 (peer access on).
Per call, on each rank:
  caller stream: write the peer's barrier word, wait for its own (stream
                 memory operations), then fan out to the copy streams;
  copy streams:  chunk i into the peer's landing buffer (cuMemcpyDtoDAsync,
                 chunks alternating between the copy streams), then
                 cuStreamWriteValue32 of the stream's chunk count into the
                 peer's word (the write orders after the copy);
  caller stream: per chunk, wait for this rank's copy of it (an event: the
                 sum overwrites the input that copy reads) and for the
                 peer's count (cuStreamWaitValue32 >=, with
                 CU_STREAM_WAIT_VALUE_FLUSH where the GPU supports it),
                 then a kernel sums the landed chunk into the input in
                 place (f32); --no-sum keeps the waits and drops the kernel.
The landing buffer holds the whole message (no slot reuse within a call).
Each call is queued behind a sleeping kernel on both GPUs and timed with
CUDA events on each caller stream; per call the slower and the faster
rank's times (the slower includes the skew of the two starts), medians
over --iters calls. Inputs depend on the position; every call's result is
checked against the expected sum (not with --no-sum). Per size it also
times one copy of the whole message each way at once, alone and while
each GPU sums other buffers.

    python3 bench/ce_pipeline_probe.py --sizes 16M,64M,256M,1G --chunks 4M,8M,16M
"""
import argparse, ctypes, statistics, sys, os
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm_link_probe import cu, check, cubin  # noqa: E402

SUM_SRC = r"""
extern "C" __global__ void add_in_place(float4* x, const float4* y, long long n4) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 a = x[i], b = __ldcg(y + i);
    a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
    x[i] = a;
  }
}
extern "C" __global__ void sleep_us(int us) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < 1000ull * us);
}
"""

GEQ = 0
# cuStreamWaitValue32: flush remote writes that reached the GPU before the
# wait was satisfied (used where the device supports it).
WAIT_FLUSH = 1 << 30
CAN_FLUSH_REMOTE_WRITES = 98  # CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES


def parse(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


class Rank:
    def __init__(self, d, nmax, copy_streams):
        self.d = d
        torch.cuda.set_device(d)
        torch.zeros(1, device=f"cuda:{d}")
        self.ctx = ctypes.c_void_p(); check(cu.cuCtxGetCurrent(ctypes.byref(self.ctx)), "cuCtxGetCurrent")
        major, minor = torch.cuda.get_device_capability(d)
        mod = ctypes.c_void_p(); check(cu.cuModuleLoadData(ctypes.byref(mod), cubin(f"sm_{major}{minor}", SUM_SRC)), "cuModuleLoadData")
        self.f = {}
        for name in ("add_in_place", "sleep_us"):
            f = ctypes.c_void_p(); check(cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()), "cuModuleGetFunction")
            self.f[name] = f
        self.s = torch.cuda.Stream(device=d)
        self.copies = [torch.cuda.Stream(device=d) for _ in range(copy_streams)]
        self.input = torch.empty(nmax // 4, dtype=torch.float32, device=f"cuda:{d}")
        self.landing = torch.empty(nmax // 4, dtype=torch.float32, device=f"cuda:{d}")
        self.pattern = (torch.arange(nmax // 4, device=f"cuda:{d}") % 4099).to(torch.float32)
        # words: [0] barrier, [1 + k] chunks landed from the peer's copy stream k
        self.words = torch.zeros(64, dtype=torch.int32, device=f"cuda:{d}")
        flush = ctypes.c_int(0)
        check(cu.cuDeviceGetAttribute(ctypes.byref(flush), CAN_FLUSH_REMOTE_WRITES, d), "cuDeviceGetAttribute")
        self.wait_flags = GEQ | (WAIT_FLUSH if flush.value else 0)

    def word(self, i):
        return ctypes.c_uint64(self.words.data_ptr() + 4 * i)

    def launch(self, name, grid, block, vals, stream):
        ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
        check(cu.cuLaunchKernel(self.f[name], grid, 1, 1, block, 1, 1, 0, ctypes.c_void_p(stream.cuda_stream), ptrs, None), f"launch {name}")


def raw(s):
    return ctypes.c_void_p(s.cuda_stream)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="16M,64M,256M,1G")
    ap.add_argument("--chunks", default="4M,8M,16M")
    ap.add_argument("--copy-streams", default="1,2")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--sum-blocks", default="264", help="grid of the sum kernel (512 threads a block), comma-separated")
    ap.add_argument("--no-sum", action="store_true",
                    help="keep every copy, write and wait but launch no sum kernel (the result is then not checked)")
    a = ap.parse_args()
    sizes = [parse(x) for x in a.sizes.split(",")]
    chunks = [parse(x) for x in a.chunks.split(",")]
    ncs = [int(x) for x in a.copy_streams.split(",")]
    grids = [int(x) for x in a.sum_blocks.split(",")]
    nmax = max(sizes)
    ranks = [Rank(0, nmax, max(ncs)), Rank(1, nmax, max(ncs))]
    for me, peer in ((ranks[0], ranks[1]), (ranks[1], ranks[0])):
        torch.cuda.set_device(me.d)
        r = cu.cuCtxEnablePeerAccess(peer.ctx, 0)
        if r not in (0, 704):
            raise SystemExit(f"cuCtxEnablePeerAccess {me.d}->{peer.d}: {r}")
    counts = {"bar": 0, "landed": [[0] * max(ncs) for _ in ranks]}
    print(f"{torch.cuda.get_device_name(0)} x2; all-reduce f32 in place; us = slower rank's median of {a.iters}; busbw = bytes/us (2 ranks)")

    def ce_both(n, busy=False):
        """Both ranks' whole input into the other's landing buffer at once;
        busy: each GPU meanwhile sums a scratch buffer of n bytes four times
        (264 blocks) on a stream of its own."""
        ts = []
        scratch = {}
        if busy:
            for r in ranks:
                torch.cuda.set_device(r.d)
                scratch[r.d] = (torch.ones(n // 4, device=f"cuda:{r.d}"), torch.ones(n // 4, device=f"cuda:{r.d}"),
                                torch.cuda.Stream(device=r.d))
        for it in range(a.iters + 2):
            evs = []
            for r in ranks:
                torch.cuda.set_device(r.d)
                r.launch("sleep_us", 1, 1, [ctypes.c_int(300)], r.s)
                if busy:
                    x, y, side = scratch[r.d]
                    r.launch("sleep_us", 1, 1, [ctypes.c_int(300)], side)
                    for _ in range(4):
                        r.launch("add_in_place", 264, 512, [ctypes.c_uint64(x.data_ptr()), ctypes.c_uint64(y.data_ptr()),
                                                            ctypes.c_longlong(n // 16)], side)
            for r, p in ((ranks[0], ranks[1]), (ranks[1], ranks[0])):
                torch.cuda.set_device(r.d)
                e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
                e0.record(r.s)
                check(cu.cuMemcpyDtoDAsync_v2(ctypes.c_uint64(p.landing.data_ptr()), ctypes.c_uint64(r.input.data_ptr()),
                                              ctypes.c_size_t(n), raw(r.s)), "memcpy")
                e1.record(r.s); evs.append((e0, e1))
            for r in ranks:
                torch.cuda.synchronize(r.d)
            if it >= 2:
                ts.append(max(e0.elapsed_time(e1) for e0, e1 in evs) * 1e3)
        return statistics.median(ts)

    def queue_call(n, chunk, nc, grid):
        counts["bar"] += 1
        evs = []
        for me, peer in ((ranks[0], ranks[1]), (ranks[1], ranks[0])):
            torch.cuda.set_device(me.d)
            e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
            e0.record(me.s)
            check(cu.cuStreamWriteValue32_v2(raw(me.s), peer.word(0), ctypes.c_uint32(counts["bar"]), 0), "write barrier")
            check(cu.cuStreamWaitValue32_v2(raw(me.s), me.word(0), ctypes.c_uint32(counts["bar"]), me.wait_flags), "wait barrier")
            go = torch.cuda.Event(); go.record(me.s)
            for c in me.copies[:nc]:
                c.wait_event(go)
            pending = []
            for i, off in enumerate(range(0, n, chunk)):
                ln = min(chunk, n - off)
                k = i % nc
                c = me.copies[k]
                check(cu.cuMemcpyDtoDAsync_v2(ctypes.c_uint64(peer.landing.data_ptr() + off), ctypes.c_uint64(me.input.data_ptr() + off),
                                              ctypes.c_size_t(ln), raw(c)), "memcpy")
                counts["landed"][peer.d][k] += 1
                check(cu.cuStreamWriteValue32_v2(raw(c), peer.word(1 + k), ctypes.c_uint32(counts["landed"][peer.d][k]), 0), "write landed")
                sent = torch.cuda.Event(); sent.record(c)
                pending.append((off, ln, k, counts["landed"][peer.d][k], sent))
            for off, ln, k, want, sent in pending:
                me.s.wait_event(sent)
                check(cu.cuStreamWaitValue32_v2(raw(me.s), me.word(1 + k), ctypes.c_uint32(want), me.wait_flags), "wait landed")
                if not a.no_sum:
                    me.launch("add_in_place", grid, 512, [ctypes.c_uint64(me.input.data_ptr() + off),
                                                     ctypes.c_uint64(me.landing.data_ptr() + off), ctypes.c_longlong(ln // 16)], me.s)
            for c in me.copies[:nc]:
                done = torch.cuda.Event(); done.record(c); me.s.wait_event(done)
            e1.record(me.s)
            evs.append((e0, e1))
        return evs

    def allreduce(n, chunk, nc, grid):
        ts = []
        for it in range(a.iters + 2):
            for r in ranks:
                torch.cuda.set_device(r.d)
                # Values that depend on the position (exact in f32), so a
                # chunk summed at the wrong offset shows.
                r.input[: n // 4].copy_(r.pattern[: n // 4]).add_(float(r.d + 1) + it)
                r.landing[: n // 4].fill_(float("nan"))
            for r in ranks:
                torch.cuda.synchronize(r.d)
            # Long enough for the host to queue both ranks' calls.
            sleep = 1000 + 100 * ((n + chunk - 1) // chunk)
            for r in ranks:
                torch.cuda.set_device(r.d)
                r.launch("sleep_us", 1, 1, [ctypes.c_int(sleep)], r.s)
            evs = queue_call(n, chunk, nc, grid)
            for r in ranks:
                torch.cuda.synchronize(r.d)
            for r in ranks if not a.no_sum else ():
                want = r.pattern[: n // 4] * 2 + float(3 + 2 * it)
                v = r.input[: n // 4]
                if not bool((v == want).all()):
                    bad = int((v != want).nonzero()[0])
                    raise SystemExit(f"rank {r.d}: element {bad} is {float(v[bad])}, expected {float(want[bad])} (n {n}, chunk {chunk})")
            if it >= 2:
                ts.append([e0.elapsed_time(e1) * 1e3 for e0, e1 in evs])
        return statistics.median(max(t) for t in ts), statistics.median(min(t) for t in ts)

    for n in sizes:
        base = ce_both(n)
        print(f"{n >> 20:5d} MiB  copy engines both ways alone: {base:8.1f} us {n / base / 1e3:6.1f} GB/s", flush=True)
        busy = ce_both(n, busy=True)
        print(f"{n >> 20:5d} MiB  copy engines both ways, each GPU summing other buffers meanwhile: {busy:8.1f} us {n / busy / 1e3:6.1f} GB/s", flush=True)
        for grid in grids:
          r = ranks[0]
          torch.cuda.set_device(r.d)
          ts = []
          for it in range(a.iters + 2):
              r.launch("sleep_us", 1, 1, [ctypes.c_int(200)], r.s)
              e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
              e0.record(r.s)
              r.launch("add_in_place", grid, 512, [ctypes.c_uint64(r.input.data_ptr()), ctypes.c_uint64(r.landing.data_ptr()),
                                                   ctypes.c_longlong(n // 16)], r.s)
              e1.record(r.s); torch.cuda.synchronize(r.d)
              if it >= 2:
                  ts.append(e0.elapsed_time(e1) * 1e3)
          print(f"{n >> 20:5d} MiB  the sum alone, grid {grid:3d}: {statistics.median(ts):8.1f} us", flush=True)
          for nc in ncs:
            for chunk in chunks:
                if chunk > n:
                    continue
                slow, fast = allreduce(n, chunk, nc, grid)
                print(f"{n >> 20:5d} MiB  chunk {chunk >> 20:3d} MiB, {nc} copy stream(s), {'no sum' if a.no_sum else f'sum grid {grid:3d}'}: slower rank {slow:8.1f} us {n / slow / 1e3:6.1f} GB/s, faster {fast:8.1f} us {n / fast / 1e3:6.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
