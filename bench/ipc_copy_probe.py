#!/usr/bin/env python3
"""How fast the copy engines write into another process's GPU memory opened
through legacy CUDA IPC (cudaIpcOpenMemHandle, what torch.multiprocessing
shares and what tensorcomm's symmetric memory maps), against memory of the
same process on that GPU: 256 MiB from cuda:0 into cuda:1, three ways
(PyTorch's copy_, cudaMemcpyAsync, cudaMemcpyPeerAsync), CUDA events,
medians of 10. Needs two GPUs.

    python3 bench/ipc_copy_probe.py
"""
import ctypes, glob, os, statistics, sys
import torch, torch.multiprocessing as mp

def cudart():
    for name in ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    import nvidia
    for p in glob.glob(os.path.join(os.path.dirname(nvidia.__path__[0]), "nvidia", "*", "lib", "libcudart.so*")):
        return ctypes.CDLL(p)
    raise SystemExit("no cudart")

def child(q, done, n):
    torch.cuda.set_device(1)
    t = torch.zeros(n, dtype=torch.uint8, device="cuda:1")
    q.put(t)
    done.get()

def timed(fn, iters=10):
    s = torch.cuda.current_stream(0)
    ts = []
    for i in range(iters + 2):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(s); fn(s); b.record(s); s.synchronize()
        if i >= 2: ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)

def main():
    n = 256 << 20
    mp.set_start_method("spawn")
    q = mp.Queue(); done = mp.Queue()
    p = mp.Process(target=child, args=(q, done, n)); p.start()
    torch.cuda.set_device(0)
    remote = q.get()
    src = torch.ones(n, dtype=torch.uint8, device="cuda:0")
    local1 = torch.zeros(n, dtype=torch.uint8, device="cuda:1")
    rt = cudart()
    def raw(dst):
        def f(s):
            r = rt.cudaMemcpyAsync(ctypes.c_void_p(dst.data_ptr()), ctypes.c_void_p(src.data_ptr()), ctypes.c_size_t(n), 3, ctypes.c_void_p(s.cuda_stream))
            assert r == 0, r
        return f
    def peer(dst):
        def f(s):
            r = rt.cudaMemcpyPeerAsync(ctypes.c_void_p(dst.data_ptr()), 1, ctypes.c_void_p(src.data_ptr()), 0, ctypes.c_size_t(n), ctypes.c_void_p(s.cuda_stream))
            assert r == 0, r
        return f
    print("peer access 0->1:", torch.cuda.can_device_access_peer(0, 1))
    for name, dst in [("same-process cuda:1", local1), ("ipc cuda:1", remote)]:
        for how, fn in [("copy_", lambda s, d=dst: d.copy_(src, non_blocking=True)), ("cudaMemcpyAsync D2D", raw(dst)), ("cudaMemcpyPeerAsync", peer(dst))]:
            us = timed(fn)
            print(f"{name:22} {how:22} {us:9.1f} us {n / us / 1e3:7.1f} GB/s", flush=True)
    done.put(1); p.join()

if __name__ == "__main__":
    main()
