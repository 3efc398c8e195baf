import ctypes, multiprocessing as mp, statistics, time, sys

class M2D(ctypes.Structure):
    _fields_ = [("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t), ("srcMemoryType", ctypes.c_int),
                ("srcHost", ctypes.c_void_p), ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
                ("srcPitch", ctypes.c_size_t), ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t),
                ("dstMemoryType", ctypes.c_int), ("dstHost", ctypes.c_void_p), ("dstDevice", ctypes.c_uint64),
                ("dstArray", ctypes.c_void_p), ("dstPitch", ctypes.c_size_t), ("WidthInBytes", ctypes.c_size_t),
                ("Height", ctypes.c_size_t)]

def worker(rank, mode, size, iters, barrier, out):
    import torch
    torch.cuda.set_device(0)
    cu = ctypes.CDLL("libcuda.so.1")
    stream = torch.cuda.Stream()
    s = ctypes.c_void_p(stream.cuda_stream)
    n = max(1, size // 4)
    host = torch.ones(max(n, 16384), dtype=torch.float32).pin_memory()
    dev = torch.zeros(max(n, 16384), dtype=torch.float32, device="cuda")
    ev = torch.cuda.Event()
    def go():
        if mode == "htod":
            r = cu.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(dev.data_ptr()), ctypes.c_void_p(host.data_ptr()), ctypes.c_size_t(size), s)
        elif mode == "2d":
            m = M2D(); m.srcMemoryType = 1; m.srcHost = host.data_ptr(); m.srcPitch = size
            m.dstMemoryType = 2; m.dstDevice = dev.data_ptr(); m.dstPitch = size; m.WidthInBytes = size; m.Height = 1
            r = cu.cuMemcpy2DAsync_v2(ctypes.byref(m), s)
        elif mode == "2d_rows":
            # the same bytes as 4-byte rows
            m = M2D(); m.srcMemoryType = 1; m.srcHost = host.data_ptr(); m.srcPitch = 4
            m.dstMemoryType = 2; m.dstDevice = dev.data_ptr(); m.dstPitch = 4; m.WidthInBytes = 4; m.Height = max(1, size // 4)
            r = cu.cuMemcpy2DAsync_v2(ctypes.byref(m), s)
        elif mode == "dtod_uva":
            r = cu.cuMemcpyDtoDAsync_v2(ctypes.c_uint64(dev.data_ptr()), ctypes.c_uint64(host.data_ptr()), ctypes.c_size_t(size), s)
        elif mode == "generic":
            r = cu.cuMemcpyAsync(ctypes.c_uint64(dev.data_ptr()), ctypes.c_uint64(host.data_ptr()), ctypes.c_size_t(size), s)
        if r != 0:
            raise SystemExit(f"{mode}: CUresult {r}")
        ev.record(stream); ev.synchronize()
    times = []
    barrier.wait()
    for i in range(iters + 10):
        t0 = time.perf_counter(); go()
        if i >= 10: times.append((time.perf_counter() - t0) * 1e6)
    ok = bool((dev[: max(1, size // 4)] == 1).all().item())
    out.put((rank, statistics.median(times), ok))

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    for mode in ["htod", "2d", "2d_rows", "dtod_uva", "generic"]:
        for size in [8, 4096, 32768]:
            row = []
            for n in [1, 2]:
                b, q = ctx.Barrier(n), ctx.Queue()
                ps = [ctx.Process(target=worker, args=(r, mode, size, 100, b, q)) for r in range(n)]
                [p.start() for p in ps]
                res = []
                for _ in ps:
                    try: res.append(q.get(timeout=60))
                    except Exception as e: res.append((None, float('nan'), False))
                [p.join(5) for p in ps]
                row.append(f"n={n} {max(r[1] for r in res):8.1f} us ok={all(r[2] for r in res)}")
            print(f"{mode:>9} {size:>6}B  " + "  ".join(row), flush=True)
