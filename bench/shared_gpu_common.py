"""Pieces shared by the probes of processes sharing one GPU
(shared_gpu_copies.py, shared_gpu_reduce.py): sizes from the command line,
a copy as equal rows through the driver API, and the printed row."""
import ctypes

# CUmemorytype
HOST, DEVICE = 1, 2


def parse_size(s):
    """'8', '64K', '16M', '1G' -> bytes."""
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if mult > 1 else s) * mult


class Memcpy2D(ctypes.Structure):
    """CUDA_MEMCPY2D."""
    _fields_ = [("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t),
                ("srcMemoryType", ctypes.c_int), ("srcHost", ctypes.c_void_p),
                ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
                ("srcPitch", ctypes.c_size_t), ("dstXInBytes", ctypes.c_size_t),
                ("dstY", ctypes.c_size_t), ("dstMemoryType", ctypes.c_int),
                ("dstHost", ctypes.c_void_p), ("dstDevice", ctypes.c_uint64),
                ("dstArray", ctypes.c_void_p), ("dstPitch", ctypes.c_size_t),
                ("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t)]


def rows_params(dst, dst_type, src, src_type, nbytes, rows):
    """The CUDA_MEMCPY2D that copies `nbytes` (a multiple of `rows`) from
    address `src` to `dst` as `rows` equal rows; types are HOST or DEVICE."""
    m = Memcpy2D()
    m.srcMemoryType, m.dstMemoryType = src_type, dst_type
    if src_type == HOST:
        m.srcHost = src
    else:
        m.srcDevice = src
    if dst_type == HOST:
        m.dstHost = dst
    else:
        m.dstDevice = dst
    m.srcPitch = m.dstPitch = m.WidthInBytes = nbytes // rows
    m.Height = rows
    return m


def copy_rows(dst, dst_type, src, src_type, nbytes, rows, stream):
    """Queues that copy on torch stream `stream` as one cuMemcpy2DAsync."""
    m = rows_params(dst, dst_type, src, src_type, nbytes, rows)
    r = ctypes.CDLL("libcuda.so.1").cuMemcpy2DAsync_v2(ctypes.byref(m), ctypes.c_void_p(stream.cuda_stream))
    if r != 0:
        raise RuntimeError(f"cuMemcpy2DAsync_v2: CUresult {r}")


def print_row(n, sizes, results):
    """One table row: for each size the slowest process's median and 10th
    percentile, from `results` = [(rank, {size: (median, p10)})]."""
    cells = []
    for s in sizes:
        med = max(r[1][s][0] for r in results)
        p10 = max(r[1][s][1] for r in results)
        cells.append(f"{med:>8.1f} /{p10:>6.1f}")
    print(f"{n:>5} " + " ".join(f"{c:>16}" for c in cells), flush=True)


def run_all(processes, out):
    """Starts `processes`, gathers one result from each off queue `out`,
    and joins them."""
    for p in processes:
        p.start()
    results = [out.get() for _ in processes]
    for p in processes:
        p.join()
    return results
