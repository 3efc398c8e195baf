
// ---- all-reduce over peer memory (cuda::intranode) -------------------------
// Every rank's symmetric buffer and signal pad are mapped into every rank's
// address space (CUDA IPC). Block b of every rank handles the same part of
// the data, so ranks synchronise block by block. Each barrier has a number
// (epoch): block b of a rank counts its barriers in its own pad's word
// PEER_FLAGS + b (every rank runs the same calls with the same grids, so
// the counts agree). Arriving stores the epoch, with release semantics at
// system scope, into word b * PEER_MAX + (this rank) of each peer's pad;
// waiting reads word b * PEER_MAX + p of this rank's pad, with acquire
// semantics, until rank p's epoch is there. No atomics, no fences, no
// reset: graph replays count on. Spinning gives up when the host raises
// `abort_flag` or after `timeout_ns`, and leaves in `status` why
// (code << 16 | peer): 1 the peer did not arrive in time, 2 aborted (3 is
// the host's, a call that failed to queue; 4 a registered call whose
// slot was never written, REG_UNREGISTERED). The
// host words live in host memory: only spinning threads read them, every
// 256 tries (a read crosses PCIe).
// Data of peers is read with ld.global.cg (L2, never a stale L1 line).
// Element types: OpF32, OpF16 and OpBF16 above (f32 accumulation).
//
// The push kernel (small messages) has no barrier: each rank stores its
// input straight into every peer's inbox, each 4-byte word beside a flag
// (the call's number) in one 8-byte store, which arrives whole; a rank
// reduces once every flag of its inbox shows the call. See peer_push.
//
// The large kernel (large messages) writes where two-shot reads: each
// rank stores its input's slices straight into their owners' buffers,
// reduces its own slice from its buffer (local reads only), stores the
// result into every peer's buffer, and copies what the peers stored back
// into its output, chunk by chunk inside one kernel. See peer_large.
//
// The registered kernel (captured calls whose tensors were registered
// after the capture) reads and writes the ranks' tensors themselves, no
// buffer in between. See peer_registered.

#define PEER_MAX 8
#define PEER_BLOCKS 128
#define PEER_FLAGS (PEER_BLOCKS * PEER_MAX)
// The push kernel's largest grid (a communicator keeps one grid, so that a
// vector always belongs to the same block), and its per-block call counts
// after the barrier counts.
#define PUSH_BLOCKS 32
// Its block size, two blocks an SM at least: a thread holds every peer's
// two lines of a vector at once (registers for 512 threads would run out).
#define PUSH_THREADS 256
#define PUSH_COUNTS (PEER_FLAGS + PEER_BLOCKS)
// The pad word a kernel that gave up sets (after the push counts), or the
// host when a call failed to queue: every later kernel of the
// communicator then ends at once, before it arrives at a barrier or sends
// anything, so no peer can pass a barrier on the arrival of a call that
// will not do its part; waits in progress give up too.
#define PEER_STOPPED (PUSH_COUNTS + PUSH_BLOCKS)

struct PeerArgs {
  u64 buf[PEER_MAX];
  u64 pad[PEER_MAX];
  u64 input;
  u64 output;
  u64 numel;
  u64 abort_flag;
  u64 status;
  u64 timeout_ns;
  u64 table;        // registered: this call's slot of the graph-input table
  u32 rank;
  u32 world;
  u32 op;           // 0 sum, 1 avg, 2 min, 3 max
  u32 end_barrier;  // 1: also synchronise after the data is read
  u32 io_aligned;   // 1: input and output are 16-byte aligned
  u32 slot;         // push: bytes of one sender's part of an inbox half;
                    // large: bytes of one rank's slot of each area
  u32 overlap;      // 1: launched as a programmatic dependent launch
};

__device__ __forceinline__ u64 peer_now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// This rank's PEER_STOPPED word.
__device__ __forceinline__ u64 peer_stop_word(const PeerArgs& a) { return a.pad[a.rank] + 4 * PEER_STOPPED; }

// Marks this rank's communicator stopped (see PEER_STOPPED).
__device__ __forceinline__ void peer_mark_stopped(const PeerArgs& a) { *(volatile u32*)peer_stop_word(a) = 1; }

// True (in every thread of the block) when an earlier kernel of this
// rank's communicator gave up: this one then does nothing.
__device__ __forceinline__ bool peer_stopped(const PeerArgs& a) {
  __shared__ u32 stopped;
  if (threadIdx.x == 0) stopped = *((volatile u32*)a.pad[a.rank] + PEER_STOPPED);
  __syncthreads();
  return stopped != 0;
}

__device__ __forceinline__ void peer_store_release(u32* p, u32 v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ u32 peer_load_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Called every 256 tries of a wait for `peer`: true (and the reason left
// in `status`) when the host raised the abort word or the wait, which
// began at `*start` (0: now), has passed the timeout; true also when this
// rank's communicator was stopped meanwhile (`stop`, its PEER_STOPPED
// word: another block gave up, or the host refused a call), the reason
// then left by whoever stopped it.
// (The arguments' three fields, not the whole block: a reference to it
// would make every kernel copy it to local memory.)
__device__ __noinline__ bool peer_give_up_at(u64 abort_flag, u64 status, u64 timeout_ns, u64 stop, u64* start,
                                             u32 peer) {
  if (*(volatile u32*)stop != 0) return true;
  if (*(volatile u32*)abort_flag != 0) {
    atomicCAS_system((u32*)status, 0u, (2u << 16) | peer);
    return true;
  }
  const u64 t = peer_now_ns();
  if (*start == 0) {
    *start = t;
  } else if (t - *start > timeout_ns) {
    atomicCAS_system((u32*)status, 0u, (1u << 16) | peer);
    return true;
  }
  return false;
}

__device__ __forceinline__ bool peer_give_up(const PeerArgs& a, u64* start, u32 peer) {
  if (!peer_give_up_at(a.abort_flag, a.status, a.timeout_ns, peer_stop_word(a), start, peer)) return false;
  peer_mark_stopped(a);
  return true;
}

// Waits until *word has reached `epoch` (counts wrap: compared as a
// signed difference).
__device__ __noinline__ bool peer_wait_at(const u32* word, u32 epoch, u64 abort_flag, u64 status, u64 timeout_ns,
                                          u64 stop, u32 peer) {
  u64 start = 0;
  for (u32 n = 1;; ++n) {
    if ((int)(peer_load_acquire(word) - epoch) >= 0) return true;
    if ((n & 255) == 0 && peer_give_up_at(abort_flag, status, timeout_ns, stop, &start, peer)) return false;
  }
}

__device__ __forceinline__ bool peer_wait(const u32* word, u32 epoch, const PeerArgs& a, u32 peer) {
  if (peer_wait_at(word, epoch, a.abort_flag, a.status, a.timeout_ns, peer_stop_word(a), peer)) return true;
  peer_mark_stopped(a);
  return false;
}

// Synchronises this block with block blockIdx.x of every other rank.
__device__ bool peer_barrier(const PeerArgs& a) {
  __shared__ u32 failed;
  __shared__ u32 epoch;
  u32* own = (u32*)a.pad[a.rank];
  if (threadIdx.x == 0) {
    volatile u32* count = own + PEER_FLAGS + blockIdx.x;
    epoch = *count + 1;
    *count = epoch;
    failed = 0;
  }
  __syncthreads();
  const u32 p = threadIdx.x;
  if (p < a.world && p != a.rank) {
    peer_store_release((u32*)a.pad[p] + blockIdx.x * PEER_MAX + a.rank, epoch);
    if (!peer_wait(own + blockIdx.x * PEER_MAX + p, epoch, a, p)) failed = 1;
  }
  __syncthreads();
  return failed == 0;
}

// Vector v (16 bytes) of this rank's tensor at `p`, or the elements of it
// below numel (the rest left as they were in `out`).
// Vector v (16 bytes) of the tensor of numel elements at p, or the
// elements of it below numel (the rest zero): whole when `aligned`,
// element by element otherwise. With L2, through L2 (data peers write
// during the call: ld.global.cg, and volatile element loads).
template <typename Op, bool L2>
__device__ __forceinline__ uint4 load_vector(u64 p, u64 v, u64 numel, bool aligned) {
  typedef typename Op::S S;
  const int N = 16 / sizeof(S);
  const u64 first = v * N;
  if (aligned && first + N <= numel) return L2 ? __ldcg((const uint4*)p + v) : ((const uint4*)p)[v];
  uint4 r = make_uint4(0, 0, 0, 0);
  S* e = (S*)&r;
  // (The conditional makes both element loads volatile, also without L2:
  // slower for unaligned tensors only. 3a3fb66 split it into two
  // statements, with a change to push's polling; with both, push's 64 KiB
  // calls took 0.7 us longer on two H200s, and neither was kept.)
  for (int j = 0; j < N; ++j)
    if (first + j < numel) e[j] = L2 ? ((const volatile S*)p)[first + j] : ((const S*)p)[first + j];
  return r;
}

// Stores vector v, or the elements of it below numel, as load_vector reads.
template <typename Op>
__device__ __forceinline__ void store_vector(u64 p, u64 v, u64 numel, bool aligned, uint4 x) {
  typedef typename Op::S S;
  const int N = 16 / sizeof(S);
  const u64 first = v * N;
  if (aligned && first + N <= numel) {
    ((uint4*)p)[v] = x;
    return;
  }
  const S* e = (const S*)&x;
  for (int j = 0; j < N; ++j)
    if (first + j < numel) ((S*)p)[first + j] = e[j];
}

template <typename Op>
__device__ __forceinline__ uint4 peer_load_user(const PeerArgs& a, u64 p, u64 v) {
  return load_vector<Op, false>(p, v, a.numel, a.io_aligned != 0);
}

template <typename Op>
__device__ __forceinline__ void peer_store_user(const PeerArgs& a, u64 p, u64 v, uint4 r) {
  store_vector<Op>(p, v, a.numel, a.io_aligned != 0, r);
}

// A reduction in f32 of 16-byte vectors, element by element: start with
// rank 0's vector, add the others in rank order (so every rank computes
// the same bits), then finish (AVG divides) and pack.
template <typename Op>
struct PeerAcc {
  typedef typename Op::S S;
  static const int N = 16 / sizeof(S);
  float acc[N];

  __device__ __forceinline__ void start(uint4 x) {
    const S* e = (const S*)&x;
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] = Op::in(e[j]);
  }

  __device__ __forceinline__ void add(const PeerArgs& a, uint4 x) {
    const S* e = (const S*)&x;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float y = Op::in(e[j]);
      acc[j] = a.op <= 1 ? acc[j] + y : (a.op == 2 ? fminf(acc[j], y) : fmaxf(acc[j], y));
    }
  }

  __device__ __forceinline__ uint4 finish(const PeerArgs& a) {
    if (a.op == 1) {
      const float n = (float)a.world;
#pragma unroll
      for (int j = 0; j < N; ++j) acc[j] = acc[j] / n;
    }
    uint4 out;
    S* o = (S*)&out;
#pragma unroll
    for (int j = 0; j < N; ++j) o[j] = Op::out(acc[j]);
    return out;
  }
};

// The reduction of every rank's vector (raw[r] from rank r).
template <typename Op>
__device__ __forceinline__ uint4 peer_reduce_raw(const PeerArgs& a, const uint4 (&raw)[PEER_MAX]) {
  PeerAcc<Op> acc;
  acc.start(raw[0]);
#pragma unroll
  for (int r = 1; r < PEER_MAX; ++r)
    if (r < (int)a.world) acc.add(a, raw[r]);
  return acc.finish(a);
}

// The reduction of vector v over every rank's buffer.
template <typename Op>
__device__ __forceinline__ uint4 peer_reduce_vector(const PeerArgs& a, u64 v) {
  uint4 raw[PEER_MAX];
#pragma unroll
  for (int r = 0; r < PEER_MAX; ++r)
    if (r < (int)a.world) raw[r] = __ldcg((const uint4*)a.buf[r] + v);
  return peer_reduce_raw<Op>(a, raw);
}

// One shot: block b copies its range of the input into this rank's buffer,
// synchronises with block b of every rank, then reduces that range over
// every rank's buffer into the output.
template <typename Op>
__device__ void peer_one_shot(const PeerArgs& a) {
  if (peer_stopped(a)) return;
  const int N = 16 / sizeof(typename Op::S);
  const u64 nvec = (a.numel + N - 1) / N;
  const u64 per = (nvec + gridDim.x - 1) / gridDim.x;
  const u64 lo = blockIdx.x * per;
  const u64 hi = min(lo + per, nvec);
  uint4* mine = (uint4*)a.buf[a.rank];
  for (u64 v = lo + threadIdx.x; v < hi; v += blockDim.x) mine[v] = peer_load_user<Op>(a, a.input, v);
  if (!peer_barrier(a)) return;
  for (u64 v = lo + threadIdx.x; v < hi; v += blockDim.x)
    peer_store_user<Op>(a, a.output, v, peer_reduce_vector<Op>(a, v));
  if (a.end_barrier) peer_barrier(a);
}

// Two shot: the vectors are cut into `world` slices and block b handles
// part b of every slice. Copy the input in, synchronise, reduce this
// rank's slice over every buffer (into this rank's buffer and the output),
// synchronise, then copy the other ranks' reduced slices into the output.
template <typename Op>
__device__ void peer_two_shot(const PeerArgs& a) {
  if (peer_stopped(a)) return;
  const int N = 16 / sizeof(typename Op::S);
  const u64 nvec = (a.numel + N - 1) / N;
  const u64 slice = (nvec + a.world - 1) / a.world;
  const u64 per = (slice + gridDim.x - 1) / gridDim.x;
  uint4* mine = (uint4*)a.buf[a.rank];
  for (u32 j = 0; j < a.world; ++j) {
    const u64 lo = j * slice + blockIdx.x * per;
    const u64 hi = min(min(lo + per, (j + 1) * slice), nvec);
    for (u64 v = lo + threadIdx.x; v < hi; v += blockDim.x) mine[v] = peer_load_user<Op>(a, a.input, v);
  }
  if (!peer_barrier(a)) return;
  {
    const u64 lo = a.rank * slice + blockIdx.x * per;
    const u64 hi = min(min(lo + per, (a.rank + 1) * (u64)slice), nvec);
    for (u64 v = lo + threadIdx.x; v < hi; v += blockDim.x) {
      const uint4 r = peer_reduce_vector<Op>(a, v);
      mine[v] = r;
      peer_store_user<Op>(a, a.output, v, r);
    }
  }
  if (!peer_barrier(a)) return;
  for (u32 j = 0; j < a.world; ++j) {
    if (j == a.rank) continue;
    const u64 lo = j * slice + blockIdx.x * per;
    const u64 hi = min(min(lo + per, (j + 1) * slice), nvec);
    const uint4* theirs = (const uint4*)a.buf[j];
    for (u64 v = lo + threadIdx.x; v < hi; v += blockDim.x) peer_store_user<Op>(a, a.output, v, __ldcg(theirs + v));
  }
  if (a.end_barrier) peer_barrier(a);
}

__device__ __forceinline__ void push_store(uint4* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ uint4 push_load(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// Whether a line ({word, flag, word, flag}) carries `flag` in both of its
// 8-byte halves.
__device__ __forceinline__ bool push_arrived(uint4 v, u32 flag) { return v.y == flag && v.w == flag; }

// Push: no barrier and no copy through this rank's buffer. buf[r] is rank
// r's inbox: two halves (calls alternate), each a part per sender of
// `slot` bytes. Vector v (16 bytes) of the input travels as two
// 16-byte lines {w0, flag, w1, flag} {w2, flag, w3, flag} to line 2v of
// this rank's part of every peer's inbox; 8-byte stores arrive whole, so a
// line whose two flags show this call holds this call's words. Then
// every vector is reduced, in rank order, from this rank's input and its
// own inbox, into the output.
// The flag: block b counts its calls (every rank runs every push call of
// a communicator on the same grid, at most PUSH_BLOCKS blocks, so the
// counts agree); call c flags with 2c + 1 (never 0, the zeroed inbox) in
// half c % 2, and the reader clears each line it took. A half is written
// again two calls later, once its reader is done with it: a rank starts
// call c + 2 only after its call c + 1 received every peer's data of c + 1,
// which each peer sent after its own call c had ended.
template <typename Op>
__device__ void peer_push(const PeerArgs& a) {
  const int N = 16 / sizeof(typename Op::S);
  const u64 nvec = (a.numel + N - 1) / N;
  // Runs of 32 vectors (one per lane of a warp) are dealt to the blocks in
  // turn, so that even small messages spread over every block's SM: run w
  // belongs to block w % gridDim.x, for every size.
  const u64 lane = threadIdx.x & 31;
  const u64 first = (u64)(threadIdx.x >> 5) * gridDim.x + blockIdx.x;
  const u64 step = (u64)(blockDim.x >> 5) * gridDim.x;
  // The thread's first vector is loaded before the handoff below, so that
  // (for a whole aligned vector, one 16-byte load) its load and thread 0's
  // reads of the pad are in flight together.
  const u64 v0 = first * 32 + lane;
  const uint4 x0 = v0 < nvec ? peer_load_user<Op>(a, a.input, v0) : make_uint4(0, 0, 0, 0);
  // Thread 0 reads the stop word (see PEER_STOPPED) and the block's call
  // count at once and, unless stopped, counts the call: one handoff to
  // the block for both.
  __shared__ u32 shared_count;
  __shared__ u32 shared_stopped;
  if (threadIdx.x == 0) {
    volatile u32* count = (u32*)a.pad[a.rank] + PUSH_COUNTS + blockIdx.x;
    const u32 stopped = *(volatile u32*)peer_stop_word(a);
    const u32 next = *count + 1;
    shared_stopped = stopped;
    if (stopped == 0) {
      shared_count = next;
      *count = next;
    }
  }
  __syncthreads();
  if (shared_stopped != 0) return;
  const u32 c = shared_count;
  const u32 flag = (c << 1) | 1u;
  const u64 half = (u64)(c & 1u) * a.world * a.slot;
  for (u64 w = first; w * 32 < nvec; w += step) {
    const u64 v = w * 32 + lane;
    if (v >= nvec) break;
    const uint4 x = w == first ? x0 : peer_load_user<Op>(a, a.input, v);
    const uint4 l0 = make_uint4(x.x, flag, x.y, flag);
    const uint4 l1 = make_uint4(x.z, flag, x.w, flag);
#pragma unroll
    for (int r = 0; r < PEER_MAX; ++r) {
      if (r < (int)a.world && r != (int)a.rank) {
        uint4* to = (uint4*)(a.buf[r] + half + (u64)a.rank * a.slot) + 2 * v;
        push_store(to, l0);
        push_store(to + 1, l1);
      }
    }
  }
  const u64 inbox = a.buf[a.rank] + half;
  for (u64 w = first; w * 32 < nvec; w += step) {
    const u64 v = w * 32 + lane;
    if (v >= nvec) break;
    // Every peer's two lines are loaded at once (one memory round trip, not
    // one per line); then, round after round, every line not there yet is
    // loaded again, all at once too.
    const uint4 own = w == first ? x0 : peer_load_user<Op>(a, a.input, v);
    uint4 line[2 * PEER_MAX];
#pragma unroll
    for (int r = 0; r < PEER_MAX; ++r) {
      if (r < (int)a.world && r != (int)a.rank) {
        const uint4* from = (const uint4*)(inbox + (u64)r * a.slot) + 2 * v;
        line[2 * r] = push_load(from);
        line[2 * r + 1] = push_load(from + 1);
      }
    }
    u64 start = 0;
    for (u32 n = 1;; ++n) {
      // The highest peer whose lines are not all there yet (the one a
      // timeout names).
      int missing = -1;
#pragma unroll
      for (int r = 0; r < PEER_MAX; ++r)
        if (r < (int)a.world && r != (int)a.rank &&
            !(push_arrived(line[2 * r], flag) && push_arrived(line[2 * r + 1], flag)))
          missing = r;
      if (missing < 0) break;
      if ((n & 255) == 0 && peer_give_up(a, &start, (u32)missing)) return;
#pragma unroll
      for (int r = 0; r < PEER_MAX; ++r) {
        if (r < (int)a.world && r != (int)a.rank) {
          const uint4* from = (const uint4*)(inbox + (u64)r * a.slot) + 2 * v;
          if (!push_arrived(line[2 * r], flag)) line[2 * r] = push_load(from);
          if (!push_arrived(line[2 * r + 1], flag)) line[2 * r + 1] = push_load(from + 1);
        }
      }
    }
    // The lines read are cleared, so that a line is only ever seen with
    // the flag of the call that wrote it: without this, a line left
    // unwritten for 2^31 calls would show the flag of the call 2^31 later
    // (the counts wrap) before that call's sender had written it.
#pragma unroll
    for (int r = 0; r < PEER_MAX; ++r) {
      if (r < (int)a.world && r != (int)a.rank) {
        uint4* from = (uint4*)(inbox + (u64)r * a.slot) + 2 * v;
        push_store(from, make_uint4(0, 0, 0, 0));
        push_store(from + 1, make_uint4(0, 0, 0, 0));
      }
    }
    PeerAcc<Op> acc;
#pragma unroll
    for (int r = 0; r < PEER_MAX; ++r) {
      if (r < (int)a.world) {
        const uint4 x = r == (int)a.rank
                            ? own
                            : make_uint4(line[2 * r].x, line[2 * r].z, line[2 * r + 1].x, line[2 * r + 1].z);
        if (r == 0) {
          acc.start(x);
        } else {
          acc.add(a, x);
        }
      }
    }
    peer_store_user<Op>(a, a.output, v, acc.finish(a));
  }
}

// Copies of up to LARGE_UNROLL vectors a thread keeps in flight.
#define LARGE_UNROLL 4

// Where slice j of a chunk of `len` vectors lies for this block: vectors
// [*lo, *hi) of the chunk, and where slice j starts. Every chunk of a call
// is cut the same way (slices of `slice` vectors, `per` a block), the
// last one only shorter, so a block always touches the same offsets of
// every slot: its barriers (with the same block of every rank) then
// cover every reuse of those offsets.
__device__ __forceinline__ void large_part(u64 len, u64 slice, u64 per, u32 j, u64* lo, u64* hi, u64* start) {
  *start = j * slice;
  *lo = *start + blockIdx.x * per;
  *hi = min(min(*lo + per, *start + slice), len);
}

// Copies vectors [lo, hi) of this block's part, up to LARGE_UNROLL a
// thread in flight: load(w) gives vector w, put(w, x) stores it.
template <typename Load, typename Put>
__device__ __forceinline__ void large_copy(u64 lo, u64 hi, Load load, Put put) {
  for (u64 v = lo + threadIdx.x; v < hi; v += LARGE_UNROLL * blockDim.x) {
    uint4 x[LARGE_UNROLL];
#pragma unroll
    for (int k = 0; k < LARGE_UNROLL; ++k) {
      const u64 w = v + k * blockDim.x;
      if (w < hi) x[k] = load(w);
    }
#pragma unroll
    for (int k = 0; k < LARGE_UNROLL; ++k) {
      const u64 w = v + k * blockDim.x;
      if (w < hi) put(w, x[k]);
    }
  }
}

// The chunk's slices of the other ranks, from this rank's input into
// area A of their owners' buffers (slot a.rank).
template <typename Op>
__device__ __forceinline__ void large_scatter(const PeerArgs& a, u64 base, u64 len, u64 slot, u64 slice, u64 per) {
  for (u32 j = 0; j < a.world; ++j) {
    if (j == a.rank) continue;
    u64 lo, hi, start;
    large_part(len, slice, per, j, &lo, &hi, &start);
    uint4* to = (uint4*)a.buf[j] + (u64)a.rank * slot;
    large_copy(
        lo, hi, [&](u64 w) { return peer_load_user<Op>(a, a.input, base + w); },
        [&](u64 w, uint4 x) { to[w - start] = x; });
  }
}

// This rank's slice of the chunk: every rank's part (its own from the
// input, the others' from area A) reduced in rank order, into the output
// and area B of every peer's buffer (slot a.rank).
template <typename Op>
__device__ __forceinline__ void large_reduce(const PeerArgs& a, u64 base, u64 len, u64 slot, u64 slice, u64 per) {
  u64 lo, hi, start;
  large_part(len, slice, per, a.rank, &lo, &hi, &start);
  const uint4* area = (const uint4*)a.buf[a.rank];
  for (u64 v = lo + threadIdx.x; v < hi; v += blockDim.x) {
    uint4 raw[PEER_MAX];
#pragma unroll
    for (int r = 0; r < PEER_MAX; ++r)
      if (r < (int)a.world)
        raw[r] = r == (int)a.rank ? peer_load_user<Op>(a, a.input, base + v) : __ldcg(area + (u64)r * slot + (v - start));
    const uint4 out = peer_reduce_raw<Op>(a, raw);
    peer_store_user<Op>(a, a.output, base + v, out);
#pragma unroll
    for (int r = 0; r < PEER_MAX; ++r)
      if (r < (int)a.world && r != (int)a.rank)
        ((uint4*)a.buf[r] + (a.world + a.rank) * slot)[v - start] = out;
  }
}

// The other ranks' reduced slices of the chunk, from area B into the
// output.
template <typename Op>
__device__ __forceinline__ void large_gather(const PeerArgs& a, u64 base, u64 len, u64 slot, u64 slice, u64 per) {
  for (u32 j = 0; j < a.world; ++j) {
    if (j == a.rank) continue;
    u64 lo, hi, start;
    large_part(len, slice, per, j, &lo, &hi, &start);
    const uint4* from = (const uint4*)a.buf[a.rank] + (a.world + j) * slot;
    large_copy(
        lo, hi, [&](u64 w) { return __ldcg(from + (w - start)); },
        [&](u64 w, uint4 x) { peer_store_user<Op>(a, a.output, base + w, x); });
  }
}

// Large: buf[r] is rank r's buffer, two areas of `world` slots of a.slot
// bytes each, A (reduce-scatter) then B (all-gather). The message is cut
// into slices of up to a slot, one per rank a chunk (the last chunk
// shorter), and block b handles part b of every slice (blocks synchronise
// with their own number, as in two-shot). A first barrier makes sure every
// rank has finished its previous call (whose buffers this one reuses).
// Per chunk: scatter, barrier, reduce (into the output and every peer's
// B), barrier, then the next chunk's scatter before this chunk's gather,
// so that its stores travel while the gather copies locally. Reuse is
// safe: a peer scatters the next chunk into A after the second barrier of
// this one, when every rank has read its part of A; and stores its reduced
// part of the next chunk into B after that chunk's first barrier, which
// every rank reaches only after its gather of this chunk.
template <typename Op>
__device__ void peer_large(const PeerArgs& a) {
  if (peer_stopped(a)) return;
  const int N = 16 / sizeof(typename Op::S);
  const u64 nvec = (a.numel + N - 1) / N;
  const u64 slot = a.slot / 16;
  const u64 slice = min(slot, (nvec + a.world - 1) / a.world);
  const u64 per = (slice + gridDim.x - 1) / gridDim.x;
  const u64 chunk = slice * a.world;
  if (!peer_barrier(a)) return;
  large_scatter<Op>(a, 0, min(chunk, nvec), slot, slice, per);
  for (u64 base = 0; base < nvec; base += chunk) {
    const u64 len = min(chunk, nvec - base);
    if (!peer_barrier(a)) return;
    large_reduce<Op>(a, base, len, slot, slice, per);
    if (!peer_barrier(a)) return;
    if (base + chunk < nvec) large_scatter<Op>(a, base + chunk, min(chunk, nvec - base - chunk), slot, slice, per);
    large_gather<Op>(a, base, len, slot, slice, per);
  }
  if (a.end_barrier) peer_barrier(a);
}

// ---- registered tensors (captured calls, cuda::intranode graph_inputs) ----
// A slot of the table (REG_WORDS words) says where rank p's tensor is
// reached from this rank (word p: the tensor mapped, or the rank's graph
// region when it stages), then flags (word PEER_MAX). The host writes it
// once the capture has ended and the ranks have exchanged their tensors;
// a replay before that finds no REG_REGISTERED flag and stops with status
// code REG_UNREGISTERED.
#define REG_WORDS 16
#define REG_REGISTERED 1u
// This rank's word is its graph region: it copies its tensor in before
// the first barrier and the result out after the second.
#define REG_STAGED 2u
// Every rank's address (and this rank's tensor) is 16-byte aligned.
#define REG_ALIGNED 4u
#define REG_UNREGISTERED 4u

// Registered: the vectors are cut into `world` slices, and block b of
// rank r handles part b of slice r. After a barrier (every rank's tensor
// holds its input), it reads that part of every rank's tensor, reduces it
// in rank order, and stores the result into every rank's tensor; no other
// block of any rank reads or writes those vectors, so the reduction is in
// place. A second barrier (with block b of every rank, which wrote part b
// of its slice into this rank's tensor) ends the call, so that the work
// queued after it sees every rank's stores. A rank that stages (its
// tensor could not be shared) copies part b of every slice into its graph
// region first and back after the second barrier.
template <typename Op>
__device__ void peer_registered(const PeerArgs& a) {
  if (peer_stopped(a)) return;
  __shared__ u64 at[PEER_MAX];
  __shared__ u32 flags;
  const volatile u64* slot = (const volatile u64*)a.table;
  if (threadIdx.x < PEER_MAX) at[threadIdx.x] = slot[threadIdx.x];
  if (threadIdx.x == 0) flags = (u32)slot[PEER_MAX];
  __syncthreads();
  if (!(flags & REG_REGISTERED)) {
    if (threadIdx.x == 0) {
      atomicCAS_system((u32*)a.status, 0u, (REG_UNREGISTERED << 16) | a.rank);
      peer_mark_stopped(a);
    }
    return;
  }
  const bool staged = (flags & REG_STAGED) != 0;
  const bool aligned = (flags & REG_ALIGNED) != 0;
  const int N = 16 / sizeof(typename Op::S);
  const u64 nvec = (a.numel + N - 1) / N;
  const u64 slice = (nvec + a.world - 1) / a.world;
  const u64 per = (slice + gridDim.x - 1) / gridDim.x;
  uint4* region = (uint4*)a.buf[a.rank];
  // Block b's part of slice j: [lo, hi) (large_part's cut, one chunk).
  u64 lo, hi, start;
  if (staged) {
    for (u32 j = 0; j < a.world; ++j) {
      large_part(nvec, slice, per, j, &lo, &hi, &start);
      for (u64 v = lo + threadIdx.x; v < hi; v += blockDim.x) region[v] = peer_load_user<Op>(a, a.input, v);
    }
  }
  if (!peer_barrier(a)) return;
  large_part(nvec, slice, per, a.rank, &lo, &hi, &start);
  for (u64 v = lo + threadIdx.x; v < hi; v += blockDim.x) {
    uint4 raw[PEER_MAX];
#pragma unroll
    for (int r = 0; r < PEER_MAX; ++r)
      if (r < (int)a.world) raw[r] = load_vector<Op, true>(at[r], v, a.numel, aligned);
    const uint4 out = peer_reduce_raw<Op>(a, raw);
#pragma unroll
    for (int r = 0; r < PEER_MAX; ++r)
      if (r < (int)a.world) store_vector<Op>(at[r], v, a.numel, aligned, out);
  }
  if (!peer_barrier(a)) return;
  if (staged) {
    for (u32 j = 0; j < a.world; ++j) {
      large_part(nvec, slice, per, j, &lo, &hi, &start);
      for (u64 v = lo + threadIdx.x; v < hi; v += blockDim.x) peer_store_user<Op>(a, a.input, v, __ldcg(region + v));
    }
  }
}

// Programmatic dependent launch (compute capability 9.0 and later, see
// `Function::launch_with`): a kernel launched that way (a.overlap) may be
// scheduled while the kernel before it on the stream still runs. It first
// waits for that kernel to end and its writes to be visible (before it
// reads its input, its pads or its call counts, which earlier calls
// write), then lets the kernel after it be scheduled, so that the next
// call's launch overlaps this one. Launched the usual way, a kernel does
// neither, so that no kernel after it is scheduled before it ends.
__device__ __forceinline__ void peer_launch_gate(const PeerArgs& a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (a.overlap) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
#endif
}

extern "C" __global__ void peer_one_shot_f32(const PeerArgs a) { peer_launch_gate(a); peer_one_shot<OpF32>(a); }
extern "C" __global__ void peer_one_shot_f16(const PeerArgs a) { peer_launch_gate(a); peer_one_shot<OpF16>(a); }
extern "C" __global__ void peer_one_shot_bf16(const PeerArgs a) { peer_launch_gate(a); peer_one_shot<OpBF16>(a); }
extern "C" __global__ void peer_two_shot_f32(const PeerArgs a) { peer_launch_gate(a); peer_two_shot<OpF32>(a); }
extern "C" __global__ void peer_two_shot_f16(const PeerArgs a) { peer_launch_gate(a); peer_two_shot<OpF16>(a); }
extern "C" __global__ void peer_two_shot_bf16(const PeerArgs a) { peer_launch_gate(a); peer_two_shot<OpBF16>(a); }
extern "C" __global__ void __launch_bounds__(PUSH_THREADS, 2) peer_push_f32(const PeerArgs a) { peer_launch_gate(a); peer_push<OpF32>(a); }
extern "C" __global__ void __launch_bounds__(PUSH_THREADS, 2) peer_push_f16(const PeerArgs a) { peer_launch_gate(a); peer_push<OpF16>(a); }
extern "C" __global__ void __launch_bounds__(PUSH_THREADS, 2) peer_push_bf16(const PeerArgs a) { peer_launch_gate(a); peer_push<OpBF16>(a); }
extern "C" __global__ void __launch_bounds__(512) peer_large_f32(const PeerArgs a) { peer_launch_gate(a); peer_large<OpF32>(a); }
extern "C" __global__ void __launch_bounds__(512) peer_large_f16(const PeerArgs a) { peer_launch_gate(a); peer_large<OpF16>(a); }
extern "C" __global__ void __launch_bounds__(512) peer_large_bf16(const PeerArgs a) { peer_launch_gate(a); peer_large<OpBF16>(a); }
extern "C" __global__ void __launch_bounds__(512) peer_registered_f32(const PeerArgs a) { peer_launch_gate(a); peer_registered<OpF32>(a); }
extern "C" __global__ void __launch_bounds__(512) peer_registered_f16(const PeerArgs a) { peer_launch_gate(a); peer_registered<OpF16>(a); }
extern "C" __global__ void __launch_bounds__(512) peer_registered_bf16(const PeerArgs a) { peer_launch_gate(a); peer_registered<OpBF16>(a); }
