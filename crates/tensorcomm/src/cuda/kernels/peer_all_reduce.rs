//! All-reduce kernels over memory every rank maps (`peer_all_reduce.cu`):
//! push, one-shot, two-shot, large and registered, f32, f16 and bf16 with
//! f32 accumulation,
//! for `cuda::intranode`. The caller owns the buffers, the signal pads and the
//! host words; this file lays out the arguments and picks the grid.

use super::kernel;
use crate::cuda::runtime::{Context, KernelArg, Stream};
use crate::tensor::DType;
use crate::{Error, Result};

/// Ranks one launch reduces over at most (`PEER_MAX`).
pub(crate) const PEER_MAX: usize = 8;
/// Blocks one launch uses at most (`PEER_BLOCKS`): the signal pads hold a
/// word per block and rank.
pub(crate) const PEER_BLOCKS: usize = 128;
/// Blocks of a push launch at most (`PUSH_BLOCKS`: the pads hold a count
/// per block).
pub(crate) const PUSH_BLOCKS: usize = 32;
/// Threads per push block (`PUSH_THREADS`, the kernels' launch bound).
const PUSH_THREADS: u32 = 256;
/// Threads per block.
const THREADS: u32 = 512;
/// Bytes of one rank's signal pad: a word per block and rank (the peers'
/// arrivals), then a word per block (this rank's barrier count), then a
/// word per push block (its call count), then the word a kernel that gave
/// up sets (every later kernel then ends at once).
pub(crate) const PEER_PAD_BYTES: usize = (PEER_STOPPED + 1) * 4;

/// Index of the pad word that stops the communicator's kernels
/// (`PEER_STOPPED`): set by a kernel that gave up, or by the host when a
/// call failed to queue; every later kernel then ends at entry, and waits
/// in progress give up.
pub(crate) const PEER_STOPPED: usize = PEER_BLOCKS * PEER_MAX + PEER_BLOCKS + PUSH_BLOCKS;

/// Largest message (bytes) the push kernel takes: an inbox holds, per
/// sender and for each of two calls in flight, twice this (every 4 bytes
/// travel beside a 4-byte flag).
pub(crate) const PUSH_MAX_BYTES: usize = 256 << 10;

/// Bytes of one sender's part of an inbox half (`slot` of a push call).
pub(crate) const PUSH_SLOT_BYTES: usize = 2 * PUSH_MAX_BYTES;

/// Bytes of one rank's inbox in a group of `world` ranks: two halves
/// (calls alternate), each a part per rank.
pub(crate) const fn push_inbox_bytes(world: usize) -> usize {
    2 * world * PUSH_SLOT_BYTES
}

/// Which kernel runs the all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shot {
    /// Every rank stores its input, flagged, into every peer's inbox
    /// (`buf` holds the inboxes); messages up to [`PUSH_MAX_BYTES`], on a
    /// grid of `blocks` (at most [`PUSH_BLOCKS`]) that a communicator
    /// never changes: each block counts its calls.
    Push { blocks: u32 },
    /// Every rank reads every rank's whole input.
    One,
    /// Reduce-scatter, then all-gather, through the buffers.
    Two,
    /// Reduce-scatter and all-gather by stores into the owners' buffers,
    /// in chunks of `world` slots (`slot` bytes each) inside one kernel,
    /// after a barrier: any size; the buffer holds two areas of `world`
    /// slots ([`large_slot_bytes`]).
    Large,
    /// Captured calls on registered tensors: every rank reads and writes
    /// the ranks' tensors themselves (addresses from `table`, a slot of
    /// [`REG_WORDS`] words), reducing its slice in place between two
    /// barriers; `buf` holds the graph regions (for a rank that stages).
    Registered,
}

/// Words of one slot of the graph-input table (`REG_WORDS`): where each
/// rank's tensor is reached (one address per rank, [`PEER_MAX`] at most),
/// then the flags.
pub(crate) const REG_WORDS: usize = 16;
/// Flag: the host has written the slot.
pub(crate) const REG_REGISTERED: u64 = 1;
/// Flag: this rank's address is its graph region; it copies its tensor
/// in first and the result out last.
pub(crate) const REG_STAGED: u64 = 2;
/// Flag: every address of the slot, and this rank's tensor, is 16-byte
/// aligned.
pub(crate) const REG_ALIGNED: u64 = 4;
/// Status code a registered kernel leaves when its slot was never
/// written (a replay before the tensors were registered).
pub(crate) const REG_UNREGISTERED: u32 = 4;

/// The reduction, as the kernels number it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PeerOp {
    Sum = 0,
    Avg = 1,
    Min = 2,
    Max = 3,
}

/// Mirror of `PeerArgs` in `peer_all_reduce.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerArgs {
    pub(crate) buf: [u64; PEER_MAX],
    pub(crate) pad: [u64; PEER_MAX],
    pub(crate) input: u64,
    pub(crate) output: u64,
    pub(crate) numel: u64,
    pub(crate) abort_flag: u64,
    pub(crate) status: u64,
    pub(crate) timeout_ns: u64,
    /// Registered: this call's slot of the graph-input table (else 0).
    pub(crate) table: u64,
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) op: u32,
    pub(crate) end_barrier: u32,
    pub(crate) io_aligned: u32,
    /// Push: bytes of one sender's part of an inbox half. Large: bytes of
    /// one rank's slot of each of the region's two areas.
    pub(crate) slot: u32,
    /// 1: launched as a programmatic dependent launch ([`peer_all_reduce`]
    /// launches it so, only on a GPU of compute capability 9.0 or later):
    /// the kernel then waits for the work before it and lets the next
    /// kernel be scheduled.
    pub(crate) overlap: u32,
}

/// The dtypes the kernels take.
pub(crate) fn peer_dtype_supported(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

fn kernel_name(shot: Shot, dtype: DType) -> Result<&'static str> {
    Ok(match (shot, dtype) {
        (Shot::Push { .. }, DType::F32) => "peer_push_f32",
        (Shot::Push { .. }, DType::F16) => "peer_push_f16",
        (Shot::Push { .. }, DType::BF16) => "peer_push_bf16",
        (Shot::One, DType::F32) => "peer_one_shot_f32",
        (Shot::One, DType::F16) => "peer_one_shot_f16",
        (Shot::One, DType::BF16) => "peer_one_shot_bf16",
        (Shot::Two, DType::F32) => "peer_two_shot_f32",
        (Shot::Two, DType::F16) => "peer_two_shot_f16",
        (Shot::Two, DType::BF16) => "peer_two_shot_bf16",
        (Shot::Large, DType::F32) => "peer_large_f32",
        (Shot::Large, DType::F16) => "peer_large_f16",
        (Shot::Large, DType::BF16) => "peer_large_bf16",
        (Shot::Registered, DType::F32) => "peer_registered_f32",
        (Shot::Registered, DType::F16) => "peer_registered_f16",
        (Shot::Registered, DType::BF16) => "peer_registered_bf16",
        (_, other) => {
            return Err(Error::InvalidArgument(format!(
                "peer all-reduce kernels: expected f32, f16 or bf16, found {other}"
            )))
        }
    })
}

/// Bytes of symmetric buffer a call of `numel` elements of `dtype` uses:
/// whole 16-byte vectors.
pub(crate) fn peer_buffer_bytes(numel: usize, dtype: DType) -> usize {
    (numel * dtype.size()).div_ceil(16) * 16
}

/// Bytes of one rank's slot in each of the two areas a large call lays
/// out in a buffer of `bytes` for `world` ranks: whole 16-byte vectors, at
/// most what the kernel's 32-bit field holds. A chunk is `world` slots,
/// half the buffer.
pub(crate) fn large_slot_bytes(bytes: usize, world: usize) -> usize {
    (bytes / (2 * world.max(1))).min(1 << 31) / 16 * 16
}

/// The push grid of a communicator whose GPUs each run up to
/// `ranks_per_gpu` of its ranks: every block of every rank on one GPU
/// must be resident at once (each waits for the others' data), so ranks
/// sharing a GPU split [`PUSH_BLOCKS`] between them (two blocks fit an SM,
/// so 16 SMs always hold them).
pub(crate) fn push_grid(ranks_per_gpu: usize) -> u32 {
    (PUSH_BLOCKS / ranks_per_gpu.max(1)).max(1) as u32
}

/// The grid of a call: a function of the call alone (not of the GPU), so
/// that every rank launches the same blocks and block b meets block b.
/// Push calls take the communicator's fixed grid.
/// Large calls take the blocks two-shot would give a slice of up to a
/// slot (`slot` bytes). At most `max_blocks` (see [`peer_max_blocks`]).
pub(crate) fn peer_grid(
    shot: Shot,
    numel: usize,
    dtype: DType,
    world: usize,
    slot: usize,
    max_blocks: usize,
) -> u32 {
    let vectors = peer_buffer_bytes(numel, dtype) / 16;
    let per_block_work = match shot {
        Shot::Push { blocks } => return blocks,
        Shot::One => vectors,
        Shot::Two | Shot::Registered => vectors.div_ceil(world.max(1)),
        Shot::Large => vectors.div_ceil(world.max(1)).min(slot / 16),
    };
    per_block_work
        .div_ceil(THREADS as usize)
        .clamp(1, max_blocks.clamp(1, PEER_BLOCKS)) as u32
}

/// The most blocks a one-shot, two-shot or large launch takes when
/// `ranks_per_gpu` ranks of the communicator share a GPU: all of them,
/// unless ranks share one, whose blocks must then all be resident at once
/// if the ranks are threads of one process (each waits for the others';
/// a large block fills an SM): 64 blocks shared between them, so such
/// ranks need a GPU of at least 64 SMs (H100 and H200 have 132, A100 108;
/// smaller ones such as the L4 would wait until the kernel timeout).
pub(crate) fn peer_max_blocks(ranks_per_gpu: usize) -> usize {
    if ranks_per_gpu <= 1 {
        PEER_BLOCKS
    } else {
        (PEER_BLOCKS / 2 / ranks_per_gpu).max(1)
    }
}

/// Queues one all-reduce kernel on `stream`. The caller's contract: every
/// address in `args` is live until the stream has run the kernel (the
/// buffers at least [`peer_buffer_bytes`] long, for push the inboxes
/// [`push_inbox_bytes`] with `slot` [`PUSH_SLOT_BYTES`], the pads
/// [`PEER_PAD_BYTES`], for large a region of two areas of `world` slots
/// of `slot` bytes), and every rank of `args.world` queues the same
/// kernel with the same `numel` in the same order.
/// `max_blocks` bounds the grid (every rank must pass the same).
/// `args.overlap` set: a programmatic dependent launch (see
/// `Function::launch_with`; every kernel here then waits for the work
/// before it on entry).
pub(crate) fn peer_all_reduce(
    ctx: &Context,
    stream: &Stream,
    shot: Shot,
    dtype: DType,
    args: &PeerArgs,
    max_blocks: usize,
) -> Result<()> {
    let world = args.world as usize;
    if world == 0 || world > PEER_MAX || args.rank as usize >= world {
        return Err(Error::InvalidArgument(format!(
            "peer all-reduce kernels: expected rank < world <= {PEER_MAX}, found rank {} of {world}",
            args.rank
        )));
    }
    if let Shot::Push { blocks } = shot {
        if args.numel as usize * dtype.size() > PUSH_MAX_BYTES
            || args.slot as usize != PUSH_SLOT_BYTES
            || blocks == 0
            || blocks as usize > PUSH_BLOCKS
        {
            return Err(Error::InvalidArgument(format!(
                "peer push kernel: expected at most {PUSH_MAX_BYTES} bytes, inbox parts of {PUSH_SLOT_BYTES} and 1 to {PUSH_BLOCKS} blocks, found {} bytes, parts of {} and {blocks} blocks",
                args.numel as usize * dtype.size(),
                args.slot
            )));
        }
    }
    if shot == Shot::Registered && (args.table == 0 || !args.table.is_multiple_of(8)) {
        return Err(Error::InvalidArgument(format!(
            "peer registered kernel: expected the address of a table slot, found {:#x}",
            args.table
        )));
    }
    if shot == Shot::Large && (args.slot == 0 || !args.slot.is_multiple_of(16)) {
        return Err(Error::InvalidArgument(format!(
            "peer large kernel: expected slots of a positive multiple of 16 bytes, found {}",
            args.slot
        )));
    }
    let function = kernel(ctx, kernel_name(shot, dtype)?)?;
    let grid = peer_grid(
        shot,
        args.numel as usize,
        dtype,
        world,
        args.slot as usize,
        max_blocks,
    );
    let threads = match shot {
        Shot::Push { .. } => PUSH_THREADS,
        _ => THREADS,
    };
    function.launch_with(
        stream,
        grid,
        threads,
        &[KernelArg::new(args)],
        args.overlap != 0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_peer_kernel_opens_with_the_launch_gate() {
        // A kernel launched as a programmatic dependent launch must wait
        // for the work before it before touching memory: each entry point
        // calls the gate first.
        let source = include_str!("peer_all_reduce.cu");
        let entries: Vec<&str> = source
            .lines()
            .filter(|l| l.starts_with("extern \"C\" __global__"))
            .collect();
        assert_eq!(entries.len(), 15, "{entries:#?}");
        for line in entries {
            let body = line.split_once('{').expect("a one-line body").1;
            assert!(
                body.trim_start().starts_with("peer_launch_gate(a);"),
                "{line}"
            );
        }
    }

    #[test]
    fn every_supported_dtype_and_shot_has_a_declared_kernel() {
        for dtype in DType::ALL {
            for shot in [
                Shot::Push { blocks: 1 },
                Shot::One,
                Shot::Two,
                Shot::Large,
                Shot::Registered,
            ] {
                match kernel_name(shot, dtype) {
                    Ok(name) => {
                        assert!(peer_dtype_supported(dtype));
                        assert!(super::super::KERNELS.contains(&name), "{name}");
                    }
                    Err(_) => assert!(!peer_dtype_supported(dtype), "{dtype}"),
                }
            }
        }
    }

    #[test]
    fn the_grid_depends_on_the_call_alone_and_stays_within_the_pads() {
        assert_eq!(peer_grid(Shot::One, 2, DType::BF16, 8, 0, PEER_BLOCKS), 1);
        assert_eq!(
            peer_grid(Shot::One, 1 << 30, DType::F32, 2, 0, PEER_BLOCKS),
            PEER_BLOCKS as u32
        );
        // 512 vectors of 16 bytes fill one block; one more needs a second.
        assert_eq!(
            peer_grid(Shot::One, 512 * 4, DType::F32, 2, 0, PEER_BLOCKS),
            1
        );
        assert_eq!(
            peer_grid(Shot::One, 512 * 4 + 1, DType::F32, 2, 0, PEER_BLOCKS),
            2
        );
        // Push launches the communicator's grid whatever the size.
        let push = Shot::Push { blocks: 7 };
        assert_eq!(peer_grid(push, 1, DType::F32, 2, 0, PEER_BLOCKS), 7);
        assert_eq!(peer_grid(push, 1 << 16, DType::BF16, 8, 0, PEER_BLOCKS), 7);
        assert_eq!(push_grid(1), PUSH_BLOCKS as u32);
        assert_eq!(push_grid(2), 16);
        assert_eq!(push_grid(8), 4);
        // Two-shot cuts the vectors into one slice per rank first.
        assert_eq!(
            peer_grid(Shot::Two, 4 * 512 * 4, DType::F32, 4, 0, PEER_BLOCKS),
            1
        );
        // Large cuts its first chunk (world slots) like two-shot.
        let slot = large_slot_bytes(32 << 20, 2);
        assert_eq!(slot, 8 << 20);
        assert_eq!(
            peer_grid(Shot::Large, 4 * 512 * 4, DType::F32, 4, slot, PEER_BLOCKS),
            1
        );
        assert_eq!(
            peer_grid(Shot::Large, 1 << 30, DType::F32, 2, slot, PEER_BLOCKS),
            PEER_BLOCKS as u32
        );
        // A small buffer: chunks of 2 slots of 1 KiB, 64 vectors a slice.
        assert_eq!(
            peer_grid(Shot::Large, 1 << 20, DType::F32, 2, 1024, PEER_BLOCKS),
            1
        );
        assert_eq!(large_slot_bytes(8192, 8), 512);
        // Ranks sharing a GPU share 64 blocks.
        assert_eq!(
            peer_grid(
                Shot::Large,
                1 << 30,
                DType::F32,
                2,
                slot,
                peer_max_blocks(2)
            ),
            32
        );
        assert_eq!(peer_max_blocks(1), PEER_BLOCKS);
        assert_eq!(peer_max_blocks(3), 21);
        assert_eq!(peer_max_blocks(8), 8);
        assert_eq!(large_slot_bytes(1 << 44, 2), 1 << 31);
        assert_eq!(large_slot_bytes(2000, 2), 496);
        assert_eq!(peer_buffer_bytes(3, DType::BF16), 16);
        assert_eq!(peer_buffer_bytes(8, DType::BF16), 16);
        assert_eq!(peer_buffer_bytes(9, DType::BF16), 32);
    }

    #[test]
    fn the_sizes_the_host_lays_out_are_the_kernels_own() {
        let source = include_str!("peer_all_reduce.cu");
        for (name, value) in [
            ("PEER_MAX", PEER_MAX),
            ("PEER_BLOCKS", PEER_BLOCKS),
            ("PUSH_BLOCKS", PUSH_BLOCKS),
            ("PUSH_THREADS", PUSH_THREADS as usize),
            ("REG_WORDS", REG_WORDS),
            ("REG_REGISTERED", REG_REGISTERED as usize),
            ("REG_STAGED", REG_STAGED as usize),
            ("REG_ALIGNED", REG_ALIGNED as usize),
            ("REG_UNREGISTERED", REG_UNREGISTERED as usize),
        ] {
            let line = format!("#define {name} {value}\n");
            let line = if name.starts_with("REG_") && name != "REG_WORDS" {
                format!("#define {name} {value}u\n")
            } else {
                line
            };
            assert!(source.contains(&line), "{line}");
        }
        assert!(source.contains("#define PUSH_COUNTS (PEER_FLAGS + PEER_BLOCKS)\n"));
        assert!(source.contains("#define PEER_STOPPED (PUSH_COUNTS + PUSH_BLOCKS)\n"));
        assert_eq!(
            PEER_STOPPED,
            PEER_BLOCKS * PEER_MAX + PEER_BLOCKS + PUSH_BLOCKS
        );
    }

    #[test]
    fn the_argument_block_matches_the_kernel_layout() {
        // 16 addresses, 7 u64 and 7 u32 (then 4 bytes of padding to the
        // 8-byte alignment, as in C): what PeerArgs in the .cu holds.
        assert_eq!(std::mem::size_of::<PeerArgs>(), 16 * 8 + 7 * 8 + 7 * 4 + 4);
        assert_eq!(
            std::mem::offset_of!(PeerArgs, overlap),
            16 * 8 + 7 * 8 + 6 * 4
        );
    }
}
