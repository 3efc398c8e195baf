//! The sparse all-reduce's inputs and their independent reference.
//!
//! Rank `r` of `n` holds a 1-D sparse COO tensor of `count` entries,
//! sorted and without repeats (coalesced): the first `shared = count / 2`
//! at indices `0..shared`, which every rank holds (so the reduction sums
//! `n` duplicates there), then `own = count - shared` at indices of its
//! own, `shared + r * own + k` for `k` in `0..own`, which no other rank
//! holds. Entry `j` has value [`value`]`(r, j)`. The tensor's size is
//! `shared + n * own`. With `count` of 2 or more every rank has both
//! kinds; with 1 it has one entry of its own.
//!
//! The expected sum is accumulated here per index from every rank's
//! entries (plain arithmetic, wrapped like the dtype: see
//! [`wrap_sum`]), never by the library's coalescing.

use tensorcomm::tensor::{DType, SparseTensor};

use super::data::{decode, make, value, wrap_sum};

/// The entries every rank holds and those each rank holds alone.
fn split(count: usize) -> (usize, usize) {
    let shared = count / 2;
    (shared, count - shared)
}

/// The size of the 1-D tensor on `ranks` ranks.
fn dim(ranks: usize, count: usize) -> usize {
    let (shared, own) = split(count);
    shared + ranks * own
}

/// The index of entry `j` of `rank`'s tensor.
fn index(rank: usize, count: usize, j: usize) -> usize {
    let (shared, own) = split(count);
    if j < shared {
        j
    } else {
        shared + rank * own + (j - shared)
    }
}

/// `rank`'s input of `count` entries of `dtype` on `ranks` ranks.
pub fn input(
    (rank, ranks): (usize, usize),
    dtype: DType,
    count: usize,
) -> tensorcomm::Result<SparseTensor> {
    let indices = (0..count).map(|j| index(rank, count, j) as i64).collect();
    let values = make(dtype, count, |j| value(rank, j))?;
    SparseTensor::new(indices, values, &[dim(ranks, count)])
}

/// The coalesced SUM of every rank's input: its indices (sorted) and the
/// values at them, decoded as `dtype` stores them.
fn expected(ranks: usize, dtype: DType, count: usize) -> (Vec<i64>, Vec<f64>) {
    let mut totals = vec![0.0; dim(ranks, count)];
    let mut held = vec![false; totals.len()];
    for rank in 0..ranks {
        for j in 0..count {
            let i = index(rank, count, j);
            totals[i] += value(rank, j);
            held[i] = true;
        }
    }
    (0..totals.len())
        .filter(|&i| held[i])
        .map(|i| (i as i64, wrap_sum(dtype, totals[i])))
        .unzip()
}

/// Whether `result` is the coalesced SUM of every rank's [`input`]: the
/// same size, coalesced, the expected indices and values.
pub fn verify(
    result: &SparseTensor,
    ranks: usize,
    dtype: DType,
    count: usize,
) -> tensorcomm::Result<bool> {
    if result.sizes() != [dim(ranks, count)] || result.dtype() != dtype {
        return Ok(false);
    }
    let (indices, values) = expected(ranks, dtype, count);
    Ok(result.is_coalesced()
        && result.indices() == indices.as_slice()
        && decode(result.values())? == values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_share_half_their_entries_and_hold_the_rest_alone() {
        // count 5 on 3 ranks: 2 shared (0, 1), 3 each of their own.
        let indices: Vec<Vec<i64>> = (0..3)
            .map(|r| input((r, 3), DType::I32, 5).unwrap().indices().to_vec())
            .collect();
        assert_eq!(indices[0], [0, 1, 2, 3, 4]);
        assert_eq!(indices[1], [0, 1, 5, 6, 7]);
        assert_eq!(indices[2], [0, 1, 8, 9, 10]);
        let s = input((2, 3), DType::I32, 5).unwrap();
        assert_eq!((s.sizes(), s.is_coalesced()), (&[11][..], true));
        assert_eq!(s.values().to_vec::<i32>().unwrap(), [2, 3, 4, 0, 1]);
    }

    #[test]
    fn the_reference_sums_shared_entries_and_keeps_the_others() {
        let (indices, values) = expected(3, DType::F32, 5);
        assert_eq!(indices, (0..11).collect::<Vec<i64>>());
        // Index 0: value(r, 0) = r, summed: 0 + 1 + 2.
        assert_eq!(values[0], 3.0);
        // Index 5: rank 1's entry 2 alone, value(1, 2) = 3.
        assert_eq!(values[5], 3.0);
        let (_, bools) = expected(3, DType::Bool, 5);
        assert!(bools.iter().all(|&v| v == 0.0 || v == 1.0));
    }

    #[test]
    fn a_result_missing_a_rank_or_not_summed_fails() {
        // The coalesced sum of ranks 0 and 1 only, as if rank 2 was lost.
        let two = |dtype| -> SparseTensor {
            let (a, b) = (
                input((0, 3), dtype, 6).unwrap(),
                input((1, 3), dtype, 6).unwrap(),
            );
            let indices = [a.indices(), b.indices()].concat();
            let values = make(dtype, 12, |j| value(j / 6, j % 6)).unwrap();
            SparseTensor::new(indices, values, &[12])
                .unwrap()
                .coalesce()
                .unwrap()
        };
        assert!(!verify(&two(DType::F32), 3, DType::F32, 6).unwrap());
        // One rank's own input: right size and coalesced, but not summed.
        let own = input((0, 3), DType::F32, 6).unwrap();
        assert!(!verify(&own, 3, DType::F32, 6).unwrap());
        // The right sum, uncoalesced (its entries reversed), fails too.
        let (indices, values) = expected(3, DType::F32, 6);
        let n = indices.len();
        let reversed = SparseTensor::new(
            indices.into_iter().rev().collect(),
            make(DType::F32, n, |k| values[n - 1 - k]).unwrap(),
            &[12],
        )
        .unwrap();
        assert!(!verify(&reversed, 3, DType::F32, 6).unwrap());
        assert!(verify(&reversed.coalesce().unwrap(), 3, DType::F32, 6).unwrap());
    }
}
