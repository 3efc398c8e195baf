//! The sparse all-reduce reading what its peers send: this rank's own
//! sparse tensor is drawn from the front of the input, and the rest is
//! what the peers send it, in the order the algorithm receives (each
//! peer's metadata, then each peer's entries). Checked: no panic, no
//! allocation beyond what the input holds (the smoke test and libFuzzer's
//! malloc limit watch that: a peer's announced entry count must not make
//! this rank reserve memory before the entries arrive), only the errors a
//! lying or vanishing peer earns, and a result that is coalesced and has
//! this rank's sizes and dtype.

use std::time::{Duration, Instant};

use super::input::Input;
use super::mock_transport::StreamTransport;
use crate::cpu::sparse_all_reduce::all_reduce_sparse;
use crate::tensor::{SparseTensor, Tensor};
use crate::Error;

/// Elements this rank's own values may have (bounds what the body
/// allocates itself).
const MAX_VALUES: usize = 1 << 12;

pub fn sparse_all_reduce(data: &[u8]) {
    let mut input = Input(data);
    let world = 2 + usize::from(input.u8() % 3);
    let rank = usize::from(input.u8()) % world;
    let Some(tensor) = own_tensor(&mut input) else {
        return;
    };
    let transport = StreamTransport::new(rank, world, input.rest());
    let deadline = Instant::now() + Duration::from_secs(3600);
    match all_reduce_sparse(&transport, &tensor, deadline) {
        Ok(sum) => {
            assert!(sum.is_coalesced(), "the sum is not coalesced");
            assert_eq!(sum.sizes(), tensor.sizes(), "the sum has other sizes");
            assert_eq!(sum.dtype(), tensor.dtype(), "the sum has another dtype");
        }
        // The stream ran out (a peer that vanished), the peer's metadata or
        // count was refused, or its coordinates were out of range.
        Err(Error::PeerClosed { .. } | Error::PeerProtocol { .. } | Error::InvalidSparse(_)) => {}
        Err(other) => panic!("a peer's bytes gave an unexpected error: {other}"),
    }
}

/// This rank's tensor: up to 3 dimensions (sizes mostly small, sometimes
/// any `u64`), the trailing ones dense, up to 7 entries of `i64`, `f32` or
/// `u8` values, coordinates from the input.
fn own_tensor(input: &mut Input<'_>) -> Option<SparseTensor> {
    let ndim = usize::from(input.u8() % 4);
    let sizes: Vec<usize> = (0..ndim)
        .map(|_| match input.u8() {
            b if b >= 0xf0 => input.u64() as usize,
            b => usize::from(b % 6),
        })
        .collect();
    let dense_dim = usize::from(input.u8()) % (ndim + 1);
    let sparse_dim = ndim - dense_dim;
    let nnz = usize::from(input.u8() % 8);
    let dtype = input.u8() % 3;
    let mut shape = vec![nnz];
    shape.extend_from_slice(&sizes[sparse_dim..]);
    let numel = shape
        .iter()
        .try_fold(1usize, |n, &s| n.checked_mul(s))
        .filter(|&n| n <= MAX_VALUES)?;
    let indices: Vec<i64> = (0..sparse_dim * nnz)
        .map(|_| i64::from(input.u8() as i8))
        .collect();
    let ramp = 1..=numel as i64;
    let values = match dtype {
        0 => Tensor::from_vec(ramp.collect::<Vec<i64>>(), &shape),
        1 => Tensor::from_vec(ramp.map(|v| v as f32).collect::<Vec<f32>>(), &shape),
        _ => Tensor::from_vec(ramp.map(|v| v as u8).collect::<Vec<u8>>(), &shape),
    }
    .ok()?;
    SparseTensor::new(indices, values, &sizes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u64s(values: &[u64]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Rank 0 of 2 holding entries 0 and 2 of a [3, 4] i64 tensor (one
    /// sparse, one dense dimension), then `peer` as what rank 1 sends.
    fn two_ranks(peer: &[u8]) -> Vec<u8> {
        let mut data = vec![0, 0, 2, 3, 4, 1, 2, 0, 0, 2];
        data.extend_from_slice(peer);
        data
    }

    fn run(data: &[u8]) -> crate::Result<SparseTensor> {
        let mut input = Input(data);
        let world = 2 + usize::from(input.u8() % 3);
        let rank = usize::from(input.u8()) % world;
        let tensor = own_tensor(&mut input).expect("a valid tensor");
        let transport = StreamTransport::new(rank, world, input.rest());
        all_reduce_sparse(
            &transport,
            &tensor,
            Instant::now() + Duration::from_secs(10),
        )
    }

    #[test]
    fn an_honest_peer_is_summed() {
        // Rank 1 sends one entry at row 2 with values [10, 20, 30, 40].
        let mut peer = u64s(&[1, 1, 3, 4, 2]);
        peer.extend(u64s(&[10, 20, 30, 40]));
        let sum = run(&two_ranks(&peer)).unwrap();
        assert_eq!(sum.indices(), [0, 2]);
        assert_eq!(
            sum.values().to_vec::<i64>().unwrap(),
            [1, 2, 3, 4, 15, 26, 37, 48]
        );
    }

    #[test]
    fn a_peer_announcing_2_40_entries_then_vanishing_is_a_closed_peer() {
        // Found open by the fuzz smoke run of the `sparse` target: the
        // all-reduce reserved (and zeroed) the 40 TiB this count announces
        // before a single entry arrived. Memory now follows the entries
        // that arrive; the peer's 8 bytes run out long before that.
        let mut peer = u64s(&[1 << 40, 1, 3, 4]);
        peer.extend(u64s(&[2]));
        match run(&two_ranks(&peer)) {
            Err(Error::PeerClosed { peer: 1, .. }) => {}
            other => panic!("expected rank 1 to be a closed peer, found {other:?}"),
        }
    }

    #[test]
    fn an_announcement_no_rank_could_hold_is_refused() {
        // 2^58 entries of 40 bytes each are more than isize::MAX bytes:
        // no rank could have sent them, nor could this one hold the sum.
        let peer = u64s(&[1 << 58, 1, 3, 4]);
        let err = run(&two_ranks(&peer)).unwrap_err();
        let Error::PeerProtocol {
            peer: 1,
            expected,
            found,
        } = &err
        else {
            panic!("expected a protocol error from rank 1, found {err:?}");
        };
        assert!(expected.contains("at most"), "{err}");
        assert!(found.contains(&(1u64 << 58).to_string()), "{err}");
    }
}
