#!/usr/bin/env python3
"""What two GPUs' SMs carry over NVLink, against the copy engines, and
whether kernels spinning on a flag slow a copy engine's peer copy.

One process drives cuda:0 and cuda:1 (peer access on). Every timed piece
queues behind a short sleeping kernel, so both GPUs' work is queued before
either starts; CUDA events around each piece, medians of --iters:

  ce         copy engine, cuMemcpyDtoDAsync from cuda:0 into cuda:1
  push       kernel on the source GPU storing into the peer's memory
  pull       kernel on the destination GPU loading from the peer's memory
  *-both     the same on both GPUs at once, each into the other
  ce+spin    the copy while a kernel on one GPU spins on a flag in its own
             memory (volatile or acquire.sys loads) for longer than the copy

    python3 bench/sm_link_probe.py --mib 256 --iters 10
"""
import argparse, ctypes, glob, os, statistics
import torch

SRC = r"""
extern "C" __global__ void copy16(const int4* __restrict__ src, int4* dst, int n16) {
  int stride = gridDim.x * blockDim.x;
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    int4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a; dst[i + stride] = b; dst[i + 2 * stride] = c; dst[i + 3 * stride] = d;
  }
  for (; i < n16; i += stride) dst[i] = src[i];
}
__device__ unsigned long long now() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
// Spins for `us` microseconds, loading a flag word (one per block) each turn.
// mode 0: no loads; 1: volatile loads; 2: ld.acquire.sys loads.
extern "C" __global__ void spin(unsigned* flag, int us, int mode) {
  unsigned long long t0 = now(), end = t0 + 1000ull * (unsigned long long)us;
  unsigned* p = flag + blockIdx.x * 32;
  unsigned acc = 0;
  while (now() < end) {
    if (mode == 1) acc += *(volatile unsigned*)p;
    else if (mode == 2) { unsigned v; asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); acc += v; }
  }
  if (acc == 0xdeadbeef) flag[1] = acc;
}
"""


def load(names):
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            pass
    raise SystemExit(f"none of {names} could be loaded")


cu = load(["libcuda.so.1", "libcuda.so"])
nvrtc_paths = ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"] + sorted(
    glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libnvrtc.so*")))
nvrtc = load(nvrtc_paths)


def check(r, what):
    if r != 0:
        raise SystemExit(f"{what} failed: {r}")


def cubin(arch, src=None):
    prog = ctypes.c_void_p()
    check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), (src or SRC).encode(), b"probe.cu", 0, None, None), "nvrtcCreateProgram")
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
    r = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    if r != 0:
        n = ctypes.c_size_t(); nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value); nvrtc.nvrtcGetProgramLog(prog, log)
        raise SystemExit(log.value.decode())
    n = ctypes.c_size_t(); check(nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(n)), "nvrtcGetCUBINSize")
    buf = ctypes.create_string_buffer(n.value); check(nvrtc.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
    return buf.raw


class Dev:
    def __init__(self, d):
        self.d = d
        torch.cuda.set_device(d)
        torch.zeros(1, device=f"cuda:{d}")
        self.ctx = ctypes.c_void_p(); check(cu.cuCtxGetCurrent(ctypes.byref(self.ctx)), "cuCtxGetCurrent")
        major, minor = torch.cuda.get_device_capability(d)
        mod = ctypes.c_void_p(); check(cu.cuModuleLoadData(ctypes.byref(mod), cubin(f"sm_{major}{minor}")), "cuModuleLoadData")
        self.f = {}
        for name in ("copy16", "spin"):
            f = ctypes.c_void_p(); check(cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()), "cuModuleGetFunction")
            self.f[name] = f
        self.s = torch.cuda.Stream(device=d)
        self.spin_s = torch.cuda.Stream(device=d)
        self.flag = torch.zeros(1 << 16, dtype=torch.int32, device=f"cuda:{d}")

    def launch(self, name, grid, block, args, stream):
        vals = []
        for a in args:
            vals.append(ctypes.c_uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else ctypes.c_int(a))
        ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
        torch.cuda.set_device(self.d)
        check(cu.cuLaunchKernel(self.f[name], grid, 1, 1, block, 1, 1, 0, ctypes.c_void_p(stream.cuda_stream), ptrs, None), "cuLaunchKernel")

    def sleep(self, stream, us):
        self.launch("spin", 1, 1, [self.flag, us, 0], stream)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--grids", default="66,132,264")
    a = ap.parse_args()
    n = a.mib << 20
    devs = [Dev(0), Dev(1)]
    for me, peer in ((devs[0], devs[1]), (devs[1], devs[0])):
        torch.cuda.set_device(me.d)
        r = cu.cuCtxEnablePeerAccess(peer.ctx, 0)
        if r not in (0, 704):
            raise SystemExit(f"cuCtxEnablePeerAccess {me.d}->{peer.d}: {r}")
    src = [torch.ones(n // 4, dtype=torch.int32, device=f"cuda:{d}") for d in (0, 1)]
    dst = [torch.zeros(n // 4, dtype=torch.int32, device=f"cuda:{d}") for d in (0, 1)]
    torch.cuda.synchronize(0); torch.cuda.synchronize(1)
    print(f"{torch.cuda.get_device_name(0)} x2, {a.mib} MiB, medians of {a.iters}; GB/s = 1e9 bytes/s per direction")

    def timed(pieces):
        """pieces: list of (dev, stream, fn); all queued behind a sleep, timed each; returns max µs of the median."""
        per = [[] for _ in pieces]
        for it in range(a.iters + 2):
            evs = []
            for dev, s, fn in pieces:
                dev.sleep(s, 300)
            for dev, s, fn in pieces:
                torch.cuda.set_device(dev.d)
                e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
                e0.record(s); fn(); e1.record(s)
                evs.append((e0, e1))
            torch.cuda.synchronize(0); torch.cuda.synchronize(1)
            if it >= 2:
                for k, (e0, e1) in enumerate(evs):
                    per[k].append(e0.elapsed_time(e1) * 1e3)
        return max(statistics.median(p) for p in per)

    def ce(frm, to, s):
        def go():
            torch.cuda.set_device(frm)
            check(cu.cuMemcpyDtoDAsync_v2(ctypes.c_uint64(dst[to].data_ptr()), ctypes.c_uint64(src[frm].data_ptr()),
                                          ctypes.c_size_t(n), ctypes.c_void_p(s.cuda_stream)), "cuMemcpyDtoDAsync")
        return go

    def kcopy(dev, s, frm, to, grid):
        return lambda: dev.launch("copy16", grid, 512, [src[frm], dst[to], n // 16], s)

    def row(name, us):
        print(f"{name:<44} {us:9.1f} us {n / us / 1e3:7.1f} GB/s", flush=True)

    d0, d1 = devs
    row("ce 0->1", timed([(d0, d0.s, ce(0, 1, d0.s))]))
    row("ce-both", timed([(d0, d0.s, ce(0, 1, d0.s)), (d1, d1.s, ce(1, 0, d1.s))]))
    row("local copy kernel on 0, 264 blocks", timed([(d0, d0.s, kcopy(d0, d0.s, 0, 0, 264))]))
    for g in [int(x) for x in a.grids.split(",")]:
        row(f"push 0->1, {g} blocks", timed([(d0, d0.s, kcopy(d0, d0.s, 0, 1, g))]))
        row(f"push-both, {g} blocks", timed([(d0, d0.s, kcopy(d0, d0.s, 0, 1, g)), (d1, d1.s, kcopy(d1, d1.s, 1, 0, g))]))
        row(f"pull 0->1, {g} blocks", timed([(d1, d1.s, kcopy(d1, d1.s, 0, 1, g))]))
        row(f"pull-both, {g} blocks", timed([(d1, d1.s, kcopy(d1, d1.s, 0, 1, g)), (d0, d0.s, kcopy(d0, d0.s, 1, 0, g))]))
    spin_us = 20000
    for where, dev in (("destination", d1), ("source", d0)):
        for blocks, mode in ((1, 1), (128, 0), (128, 1), (128, 2), (132, 2)):
            def go(dev=dev, blocks=blocks, mode=mode):
                dev.launch("spin", blocks, 32, [dev.flag, spin_us, mode], dev.spin_s)
                ce(0, 1, d0.s)()
            us = timed([(d0, d0.s, go)])
            torch.cuda.synchronize(0); torch.cuda.synchronize(1)
            row(f"ce 0->1, spin on {where}: {blocks} blk mode {mode}", us)


if __name__ == "__main__":
    main()
