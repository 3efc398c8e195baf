//! Binomial-tree broadcast: the root's buffer reaches every rank in
//! `ceil(log2 world)` rounds, each rank receiving once from its parent and
//! then sending to its children, largest subtree first. A child
//! announces itself to its parent ([`Transport::announce`]) before it waits
//! for the data, since it sends the parent nothing else.

use std::time::Instant;

use crate::cpu::transport::Transport;
use crate::{Error, Result};

/// Copies `buf` of rank `root` into `buf` of every rank.
pub fn broadcast_tree(
    t: &dyn Transport,
    buf: &mut [u8],
    root: usize,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if root >= world {
        return Err(Error::InvalidArgument(format!(
            "broadcast: expected a root in 0..{world}, found {root}"
        )));
    }
    let vrank = (rank + world - root) % world;
    let real = |v: usize| (v + root) % world;
    let mut mask = 1;
    while mask < world {
        if vrank & mask != 0 {
            // The parent only sends: tell it this rank is here (see
            // `Transport::announce`) before waiting for its data.
            let parent = real(vrank - mask);
            t.announce(parent, deadline)?;
            t.recv(parent, buf, deadline)?;
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if vrank + mask < world {
            t.send(real(vrank + mask), buf, deadline)?;
        }
        mask >>= 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::run_ranks;

    #[test]
    fn every_rank_gets_the_roots_bytes_for_every_root() {
        for world in [1, 2, 3, 4, 8] {
            for root in 0..world {
                let results = run_ranks(world, |t| {
                    let mut buf: Vec<u8> = if t.rank() == root {
                        (0..37).map(|i| (i * 3 + root) as u8).collect()
                    } else {
                        vec![0xEE; 37]
                    };
                    broadcast_tree(
                        t,
                        &mut buf,
                        root,
                        crate::cpu::algorithms::testing::deadline(),
                    )
                    .map(|()| buf)
                });
                let expected: Vec<u8> = (0..37).map(|i| (i * 3 + root) as u8).collect();
                for (rank, got) in results.into_iter().enumerate() {
                    assert_eq!(
                        got.unwrap(),
                        expected,
                        "world {world} root {root} rank {rank}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_bad_root_is_refused() {
        let results = run_ranks(2, |t| {
            broadcast_tree(
                t,
                &mut [0u8; 4],
                2,
                crate::cpu::algorithms::testing::deadline(),
            )
        });
        for r in results {
            assert!(matches!(r, Err(Error::InvalidArgument(_))));
        }
    }
}
