//! Sparse all-reduce (SUM) of COO tensors, as Gloo does it: every rank
//! sends every other rank its metadata (number of entries, sparse
//! dimensions, sizes), then its indices and values; every rank concatenates
//! all entries in rank order and coalesces them. Each rank sums the same
//! entries in the same order, so all get bit-identical results.
//!
//! # What a peer's count may make this rank allocate
//!
//! A peer's metadata announces how many entries it will send. This rank
//! never reserves that up front: each rank's entries travel in pieces
//! ([`pieces`]: the first up to [`FIRST_PIECE`] bytes, each next one as
//! long as all before it), and the receiver grows its buffer by a piece
//! only as that piece is received. So a peer that announces more than it
//! sends costs this rank at most twice what actually arrived (or one
//! first piece), and then a closed peer or a timeout, never an allocation
//! of the announced size. An announcement that no rank could hold (all
//! ranks' entries together, or the summed result, over `isize::MAX`
//! bytes) is refused before anything is received, with
//! [`Error::PeerProtocol`] naming the peer, the bound and the count.
//! Entries of zero bytes (no sparse dimension and an empty dense part)
//! carry nothing to wait for and all coalesce into one, so each rank's
//! count of them is taken as at most one.

use std::ops::Range;
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

/// The size of the first piece of a rank's entries: messages up to this
/// size go in one piece.
const FIRST_PIECE: usize = 1 << 20;

/// The byte ranges a message of `len` bytes travels in: the first up to
/// [`FIRST_PIECE`], each next as long as all before it, the last cut to
/// what remains. Sender and receiver both know `len` (the receiver from
/// the metadata), so they cut it alike. Pieces double, so a message of
/// `len` bytes takes about `log2(len / FIRST_PIECE)` of them.
fn pieces(len: usize) -> impl Iterator<Item = Range<usize>> {
    let mut start = 0;
    std::iter::from_fn(move || {
        (start < len).then(|| {
            let end = start + start.max(FIRST_PIECE).min(len - start);
            let piece = start..end;
            start = end;
            piece
        })
    })
}

/// Sends `mine` to `to` while receiving `len` bytes from `from` into a
/// buffer that grows by each piece as it is received (see the module
/// docs); returns the received bytes.
fn exchange(
    t: &dyn Transport,
    to: usize,
    mine: &[u8],
    from: usize,
    len: usize,
    deadline: Instant,
) -> Result<Vec<u8>> {
    let mut theirs = Vec::new();
    let (mut outgoing, mut incoming) = (pieces(mine.len()), pieces(len));
    loop {
        match (outgoing.next(), incoming.next()) {
            (None, None) => return Ok(theirs),
            (Some(out), None) => t.send(to, &mine[out], deadline)?,
            (out, Some(piece)) => {
                theirs
                    .try_reserve_exact(piece.len())
                    .map_err(|_| Error::PeerProtocol {
                        peer: from,
                        expected: "sparse entries that fit in this rank's memory".into(),
                        found: format!("{len} bytes of entries"),
                    })?;
                theirs.resize(piece.end, 0);
                let buf = &mut theirs[piece];
                match out {
                    Some(out) => t.send_recv(to, &mine[out], from, buf, deadline)?,
                    None => t.recv(from, buf, deadline)?,
                }
            }
        }
    }
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
    // A row's bytes; with no entries here, from the dense sizes, which may
    // then be too large for any entry to exist (saturated: any count but
    // zero is refused below).
    let row_bytes = input
        .values()
        .nbytes()
        .checked_div(input.nnz())
        .unwrap_or_else(|| {
            sizes[sparse_dim..]
                .iter()
                .try_fold(input.dtype().size(), |n, &s| n.checked_mul(s))
                .unwrap_or(usize::MAX)
        });
    let entry_bytes = (sparse_dim * 8).saturating_add(row_bytes);

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
        nnz[r] = usize::try_from(read_u64(m, 0)).unwrap_or(usize::MAX);
        if entry_bytes == 0 {
            nnz[r] = nnz[r].min(1);
        }
    }
    // All entries together must fit in memory (the summed values and the
    // indices are each at most that many bytes); a count past it is one no
    // rank could have sent.
    let limit = isize::MAX as usize / entry_bytes.max(1);
    let mut total = 0usize;
    for (r, &n) in nnz.iter().enumerate() {
        if n > limit - total {
            return Err(Error::PeerProtocol {
                peer: r,
                expected: format!(
                    "at most {} sparse entries of {entry_bytes} bytes (all ranks' entries \
                     together within isize::MAX bytes, {total} announced by the ranks before)",
                    limit - total
                ),
                found: format!("{} entries announced", read_u64(&metas[r], 0)),
            });
        }
        total += n;
    }

    // Entries: this rank's indices then its values.
    let mut mine = u64s(input.indices().iter().map(|&i| i as u64));
    input.values().with_bytes(|v| mine.extend_from_slice(v))?;
    if entry_bytes == 0 {
        // As announced: nothing to send (see the module docs).
        mine.clear();
    }
    let mut entries: Vec<Vec<u8>> = vec![Vec::new(); world];
    for shift in 1..world {
        let (to, from) = ((rank + shift) % world, (rank + world - shift) % world);
        entries[from] = exchange(t, to, &mine, from, nnz[from] * entry_bytes, deadline)?;
    }
    entries[rank] = mine;

    // Concatenate in rank order and coalesce.
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
