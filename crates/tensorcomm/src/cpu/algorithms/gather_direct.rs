//! Direct gather: every rank sends its block straight to the root, which
//! receives them in rank order. One step per non-root rank; the root's
//! link carries everything, as in any gather.

use std::time::Instant;

use crate::cpu::transport::Transport;
use crate::{Error, Result};

/// Collects every rank's `input` (all the same length) into `output` of
/// rank `root`, rank `r`'s in block `r`. `output` is `world *
/// input.len()` bytes on the root and ignored elsewhere.
pub fn gather_direct(
    t: &dyn Transport,
    input: &[u8],
    output: &mut [u8],
    root: usize,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if root >= world {
        return Err(Error::InvalidArgument(format!(
            "gather: expected a root in 0..{world}, found {root}"
        )));
    }
    if rank != root {
        return t.send(root, input, deadline);
    }
    let n = input.len();
    if output.len() != world * n {
        return Err(Error::InvalidArgument(format!(
            "gather: expected an output of {world} x {n} bytes on the root, found {}",
            output.len()
        )));
    }
    for from in 0..world {
        let block = &mut output[from * n..(from + 1) * n];
        if from == rank {
            block.copy_from_slice(input);
        } else {
            t.recv(from, block, deadline)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::{deadline, run_ranks};

    #[test]
    fn the_root_gets_every_block_in_rank_order() {
        for world in [1, 2, 3, 4, 8] {
            for root in 0..world {
                for n in [0usize, 5, 3000] {
                    let pattern = |r: usize, i: usize| (r * 17 + i * 3 + root) as u8;
                    let results = run_ranks(world, |t| {
                        let input: Vec<u8> = (0..n).map(|i| pattern(t.rank(), i)).collect();
                        let mut out = if t.rank() == root {
                            vec![0xEE; world * n]
                        } else {
                            Vec::new()
                        };
                        gather_direct(t, &input, &mut out, root, deadline()).map(|()| out)
                    });
                    let expected: Vec<u8> = (0..world)
                        .flat_map(|r| (0..n).map(move |i| pattern(r, i)))
                        .collect();
                    for (rank, got) in results.into_iter().enumerate() {
                        let got = got.unwrap();
                        if rank == root {
                            assert_eq!(got, expected, "world {world} root {root} n {n}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_wrong_output_length_on_the_root_is_refused() {
        let results = run_ranks(1, |t| {
            gather_direct(t, &[1, 2], &mut [0u8; 3], 0, deadline())
        });
        assert!(matches!(results[0], Err(Error::InvalidArgument(_))));
    }
}
