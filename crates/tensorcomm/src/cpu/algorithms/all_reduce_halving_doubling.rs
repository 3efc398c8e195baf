//! Recursive halving-doubling all-reduce (Rabenseifner).
//!
//! With `p` the largest power of two not above the world size and `rem =
//! world - p`, ranks `0..2 rem` first pair up: each even rank hands its
//! buffer to the odd rank above it and sits out. The `p` remaining ranks
//! then run a reduce-scatter by recursive halving (exchange half the
//! current range with the partner at distance `p/2, p/4, .., 1`, keep and
//! reduce the other half) and an all-gather by recursive doubling (the same
//! pairs in reverse order). Finally the odd ranks hand the result back.
//! `2 log2 p (+2)` steps, moving about `2 n` bytes per rank.

use std::time::Instant;

use super::{block_offsets, split_read_write};
use crate::cpu::reduce_kernels::{finish, reduce_into, ReduceOp};
use crate::cpu::transport::Transport;
use crate::tensor::DType;
use crate::Result;

/// All-reduces `buf` in place by recursive halving and doubling.
pub fn all_reduce_halving_doubling(
    t: &dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if world == 1 {
        return finish(op, dtype, buf, world);
    }
    let p = 1usize << (usize::BITS - 1 - world.leading_zeros());
    let rem = world - p;
    let real = |v: usize| if v < rem { 2 * v + 1 } else { v + rem };
    let mut scratch = Vec::new();

    // Fold the extra ranks into their odd neighbours.
    let vrank = if rank < 2 * rem {
        if rank % 2 == 0 {
            t.send(rank + 1, buf, deadline)?;
            None
        } else {
            scratch.resize(buf.len(), 0);
            t.recv(rank - 1, &mut scratch, deadline)?;
            reduce_into(op, dtype, buf, &scratch)?;
            Some(rank / 2)
        }
    } else {
        Some(rank - rem)
    };

    if let Some(v) = vrank {
        let offs = block_offsets(buf.len(), dtype.size(), p);
        let (mut lo, mut hi) = (0, p);
        let mut steps = Vec::new();
        let mut d = p / 2;
        while d >= 1 {
            let partner = real(v ^ d);
            let mid = (lo + hi) / 2;
            let (keep, give) = if v & d == 0 {
                ((lo, mid), (mid, hi))
            } else {
                ((mid, hi), (lo, mid))
            };
            let keep_bytes = offs[keep.0]..offs[keep.1];
            scratch.resize(keep_bytes.len(), 0);
            t.send_recv(
                partner,
                &buf[offs[give.0]..offs[give.1]],
                partner,
                &mut scratch[..keep_bytes.len()],
                deadline,
            )?;
            reduce_into(
                op,
                dtype,
                &mut buf[keep_bytes.clone()],
                &scratch[..keep_bytes.len()],
            )?;
            steps.push((partner, lo, hi));
            (lo, hi) = keep;
            d /= 2;
        }
        finish(op, dtype, &mut buf[offs[lo]..offs[hi]], world)?;
        // All-gather: undo the halving steps in reverse order.
        for (partner, plo, phi) in steps.into_iter().rev() {
            let mid = (plo + phi) / 2;
            let theirs = if lo == plo { (mid, phi) } else { (plo, mid) };
            let (mine, into) =
                split_read_write(buf, offs[lo]..offs[hi], offs[theirs.0]..offs[theirs.1]);
            t.send_recv(partner, mine, partner, into, deadline)?;
            (lo, hi) = (plo, phi);
        }
    }

    // Hand the result back to the ranks that sat out.
    if rank < 2 * rem {
        if rank % 2 == 0 {
            t.recv(rank + 1, buf, deadline)?;
        } else {
            t.send(rank - 1, buf, deadline)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::check_all_reduce;

    #[test]
    fn matches_the_reference_for_world_sizes_1_to_8() {
        check_all_reduce(
            &[1, 2, 3, 4, 5, 8],
            &[0, 1, 3, 100, 1001],
            all_reduce_halving_doubling,
        );
    }
}
