//! Sparse all-reduce (SUM) of COO tensors, as Gloo does it: every rank
//! sends every other rank its metadata (number of entries, sparse
//! dimensions, sizes), then its indices and values; every rank concatenates
//! all entries in rank order and coalesces them. Each rank sums the same
//! entries in the same order, so all get bit-identical results.

use std::time::Instant;

use super::transport::Transport;
use crate::tensor::{SparseTensor, Tensor};
use crate::{Error, Result};

fn u64s(values: impl IntoIterator<Item = u64>) -> Vec<u8> {
    values.into_iter().flat_map(u64::to_le_bytes).collect()
}

fn read_u64(bytes: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
    u64::from_le_bytes(b)
}

/// Sums `input` over all ranks; every rank gets the coalesced result.
pub(crate) fn all_reduce_sparse(
    t: &dyn Transport,
    input: &SparseTensor,
    deadline: Instant,
) -> Result<SparseTensor> {
    let (rank, world) = (t.rank(), t.world_size());
    let sizes = input.sizes();
    let sparse_dim = input.sparse_dim();
    let row_bytes = input
        .values()
        .nbytes()
        .checked_div(input.nnz())
        .unwrap_or_else(|| sizes[sparse_dim..].iter().product::<usize>() * input.dtype().size());
    let entry_bytes = sparse_dim * 8 + row_bytes;

    // Metadata: nnz, sparse_dim, then the sizes.
    let meta = u64s(
        [input.nnz() as u64, sparse_dim as u64]
            .into_iter()
            .chain(sizes.iter().map(|&s| s as u64)),
    );
    let mut metas = vec![vec![0u8; meta.len()]; world];
    for shift in 1..world {
        let (to, from) = ((rank + shift) % world, (rank + world - shift) % world);
        t.send_recv(to, &meta, from, &mut metas[from], deadline)?;
    }
    metas[rank].copy_from_slice(&meta);
    let mut nnz = vec![0usize; world];
    for (r, m) in metas.iter().enumerate() {
        let theirs: Vec<usize> = (2..2 + sizes.len())
            .map(|i| read_u64(m, i) as usize)
            .collect();
        if read_u64(m, 1) as usize != sparse_dim || theirs != sizes {
            return Err(Error::PeerProtocol {
                peer: r,
                expected: format!(
                    "a sparse tensor of sizes {sizes:?} with {sparse_dim} sparse dimensions"
                ),
                found: format!("sizes {theirs:?} with {} sparse dimensions", read_u64(m, 1)),
            });
        }
        nnz[r] = usize::try_from(read_u64(m, 0))
            .ok()
            .filter(|n| n.checked_mul(entry_bytes).is_some())
            .ok_or_else(|| Error::PeerProtocol {
                peer: r,
                expected: "a number of sparse entries this rank can hold".into(),
                found: read_u64(m, 0).to_string(),
            })?;
    }

    // Entries: this rank's indices then its values.
    let mut mine = u64s(input.indices().iter().map(|&i| i as u64));
    input.values().with_bytes(|v| mine.extend_from_slice(v))?;
    let mut entries: Vec<Vec<u8>> = Vec::with_capacity(world);
    for (r, &n) in nnz.iter().enumerate() {
        let mut buf = Vec::new();
        if r != rank {
            buf.try_reserve_exact(n * entry_bytes)
                .map_err(|_| Error::PeerProtocol {
                    peer: r,
                    expected: "a sparse tensor that fits in this rank's memory".into(),
                    found: format!("{n} entries of {entry_bytes} bytes"),
                })?;
            buf.resize(n * entry_bytes, 0);
        }
        entries.push(buf);
    }
    for shift in 1..world {
        let (to, from) = ((rank + shift) % world, (rank + world - shift) % world);
        t.send_recv(to, &mine, from, &mut entries[from], deadline)?;
    }
    entries[rank] = mine;

    // Concatenate in rank order and coalesce.
    let total: usize = nnz.iter().sum();
    let mut indices = Vec::with_capacity(total * sparse_dim);
    for d in 0..sparse_dim {
        for (r, e) in entries.iter().enumerate() {
            let base = d * nnz[r];
            indices.extend((0..nnz[r]).map(|j| read_u64(e, base + j) as i64));
        }
    }
    let mut shape = vec![total];
    shape.extend_from_slice(&sizes[sparse_dim..]);
    let values = Tensor::zeros(&shape, input.dtype())?;
    values.with_bytes_mut(|out| {
        let mut at = 0;
        for (r, e) in entries.iter().enumerate() {
            let v = &e[nnz[r] * sparse_dim * 8..];
            out[at..at + v.len()].copy_from_slice(v);
            at += v.len();
        }
    })?;
    SparseTensor::new(indices, values, sizes)?.coalesce()
}
