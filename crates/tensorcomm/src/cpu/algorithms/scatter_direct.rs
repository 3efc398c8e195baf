//! Direct scatter: the root sends block `r` of its buffer straight to rank
//! `r`, in rank order; every other rank receives once.
//!
//! Before any data moves the root and every other rank exchange an empty
//! message. Over a fingerprinting transport that message carries each
//! side's fingerprint, so ranks that disagree about the root (each of them
//! would then only send) are caught here rather than at their next
//! collective. It costs about one hop, as every rank sends it at once.

use std::time::Instant;

use crate::cpu::transport::Transport;
use crate::{Error, Result};

/// Copies block `r` of `input` on rank `root` (`world` blocks of
/// `output.len()` bytes; ignored elsewhere) into `output` of rank `r`.
pub fn scatter_direct(
    t: &dyn Transport,
    input: &[u8],
    output: &mut [u8],
    root: usize,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if root >= world {
        return Err(Error::InvalidArgument(format!(
            "scatter: expected a root in 0..{world}, found {root}"
        )));
    }
    if rank != root {
        t.send_recv(root, &[], root, &mut [], deadline)?;
        return t.recv(root, output, deadline);
    }
    let n = output.len();
    if input.len() != world * n {
        return Err(Error::InvalidArgument(format!(
            "scatter: expected an input of {world} x {n} bytes on the root, found {}",
            input.len()
        )));
    }
    for from in (0..world).filter(|&r| r != rank) {
        t.send_recv(from, &[], from, &mut [], deadline)?;
    }
    for to in 0..world {
        let block = &input[to * n..(to + 1) * n];
        if to == rank {
            output.copy_from_slice(block);
        } else {
            t.send(to, block, deadline)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::{deadline, run_ranks};

    #[test]
    fn every_rank_gets_its_block_of_the_roots_buffer() {
        for world in [1, 2, 3, 4, 8] {
            for root in 0..world {
                for n in [0usize, 6, 3000] {
                    let pattern = |r: usize, i: usize| (r * 29 + i * 5 + root) as u8;
                    let results = run_ranks(world, |t| {
                        let input: Vec<u8> = if t.rank() == root {
                            (0..world)
                                .flat_map(|r| (0..n).map(move |i| pattern(r, i)))
                                .collect()
                        } else {
                            Vec::new()
                        };
                        let mut out = vec![0xEE; n];
                        scatter_direct(t, &input, &mut out, root, deadline()).map(|()| out)
                    });
                    for (rank, got) in results.into_iter().enumerate() {
                        let expected: Vec<u8> = (0..n).map(|i| pattern(rank, i)).collect();
                        assert_eq!(
                            got.unwrap(),
                            expected,
                            "world {world} root {root} n {n} rank {rank}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_wrong_input_length_on_the_root_is_refused() {
        let results = run_ranks(1, |t| {
            scatter_direct(t, &[1, 2, 3], &mut [0u8; 2], 0, deadline())
        });
        assert!(matches!(results[0], Err(Error::InvalidArgument(_))));
    }
}
