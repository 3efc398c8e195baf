//! Direct all-reduce: every rank sends its whole buffer to every other rank
//! and reduces all of them in rank order. `world - 1` exchange steps and
//! `world` buffers of memory: the lowest latency for small messages.

use std::time::Instant;

use crate::cpu::reduce_kernels::{finish, reduce_into, ReduceOp};
use crate::cpu::transport::Transport;
use crate::tensor::DType;
use crate::Result;

/// All-reduces `buf` in place by exchanging whole buffers with every rank.
/// Every rank reduces the same buffers in the same order (rank 0, 1, ...),
/// so all get bit-identical results.
pub fn all_reduce_direct(
    t: &dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    let n = buf.len();
    if world > 1 {
        let mut all = vec![0u8; n * world];
        for shift in 1..world {
            let to = (rank + shift) % world;
            let from = (rank + world - shift) % world;
            t.send_recv(to, buf, from, &mut all[from * n..(from + 1) * n], deadline)?;
        }
        all[rank * n..(rank + 1) * n].copy_from_slice(buf);
        buf.copy_from_slice(&all[..n]);
        for other in all[n..].chunks_exact(n.max(1)) {
            reduce_into(op, dtype, buf, other)?;
        }
    }
    finish(op, dtype, buf, world)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::check_all_reduce;

    #[test]
    fn matches_the_reference_for_world_sizes_1_to_8() {
        check_all_reduce(&[1, 2, 3, 4, 8], &[0, 1, 7, 100], all_reduce_direct);
    }
}
