//! [`ExchangeBlocks`]: what an all-to-all algorithm needs of the blocks it
//! moves, so that it reads and writes them where they live (the caller's
//! tensors) instead of in staged copies.

use std::ops::Range;
use std::time::Instant;

use crate::cpu::transport::Transport;
use crate::{Error, Result};

/// The bytes one rank of an all-to-all sends and receives, block by block
/// (one block per rank, its own included), read and written in place.
///
/// A `write` may run inside a `read`'s closure (an algorithm sends one
/// block while it receives another): implementations keep every block
/// sent apart from every block received, so that nesting cannot deadlock
/// or alias.
///
/// ```
/// use std::ops::Range;
/// use std::sync::Mutex;
/// use tensorcomm::cpu::algorithms::ExchangeBlocks;
///
/// /// Block `p` of `send` goes to rank `p`; block `p` of `recv` comes from it.
/// struct Buffers { send: Vec<Vec<u8>>, recv: Vec<Mutex<Vec<u8>>> }
///
/// impl ExchangeBlocks for Buffers {
///     fn send_len(&self, peer: usize) -> usize { self.send[peer].len() }
///     fn recv_len(&self, peer: usize) -> usize { self.recv[peer].lock().unwrap().len() }
///     fn read(&self, peer: usize, range: Range<usize>, f: &mut dyn FnMut(&[u8])) -> tensorcomm::Result<()> {
///         f(&self.send[peer][range]);
///         Ok(())
///     }
///     fn write(&self, peer: usize, range: Range<usize>, f: &mut dyn FnMut(&mut [u8])) -> tensorcomm::Result<()> {
///         f(&mut self.recv[peer].lock().unwrap()[range]);
///         Ok(())
///     }
/// }
///
/// let b = Buffers { send: vec![vec![1, 2], vec![3]], recv: vec![Mutex::new(vec![0; 2])] };
/// b.read(0, 0..2, &mut |src| {
///     b.write(0, 0..2, &mut |dst| dst.copy_from_slice(src)).unwrap();
/// })?;
/// assert_eq!(*b.recv[0].lock().unwrap(), [1, 2]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub trait ExchangeBlocks {
    /// Bytes this rank sends rank `peer`.
    fn send_len(&self, peer: usize) -> usize;
    /// Bytes this rank receives from rank `peer`.
    fn recv_len(&self, peer: usize) -> usize;
    /// Runs `f` on `range` of the block for `peer` (within `send_len`).
    fn read(&self, peer: usize, range: Range<usize>, f: &mut dyn FnMut(&[u8])) -> Result<()>;
    /// Runs `f` on `range` of the block from `peer` (within `recv_len`),
    /// which it fills.
    fn write(&self, peer: usize, range: Range<usize>, f: &mut dyn FnMut(&mut [u8])) -> Result<()>;

    /// Copies the block `rank` sends itself into the block it receives
    /// from itself, which must be as long.
    fn copy_own(&self, rank: usize) -> Result<()> {
        let own = self.send_len(rank);
        if own != self.recv_len(rank) {
            return Err(Error::InvalidArgument(format!(
                "all_to_all: expected the block rank {rank} sends itself ({own} bytes) to fit the block it receives from itself ({} bytes)",
                self.recv_len(rank)
            )));
        }
        let mut copied = Ok(());
        self.read(rank, 0..own, &mut |src| {
            copied = self.write(rank, 0..own, &mut |dst| dst.copy_from_slice(src));
        })?;
        copied
    }
}

/// Sends all of `blocks`' block for rank `to` over `t`, straight from
/// where it lives.
pub(super) fn send_block(
    t: &dyn Transport,
    blocks: &dyn ExchangeBlocks,
    to: usize,
    deadline: Instant,
) -> Result<()> {
    let mut sent = Ok(());
    blocks.read(to, 0..blocks.send_len(to), &mut |src| {
        sent = t.send(to, src, deadline);
    })?;
    sent
}

/// Receives all of `blocks`' block from rank `from` over `t`, straight
/// into where it lives.
pub(super) fn recv_block(
    t: &dyn Transport,
    blocks: &dyn ExchangeBlocks,
    from: usize,
    deadline: Instant,
) -> Result<()> {
    let mut received = Ok(());
    blocks.write(from, 0..blocks.recv_len(from), &mut |dst| {
        received = t.recv(from, dst, deadline);
    })?;
    received
}
