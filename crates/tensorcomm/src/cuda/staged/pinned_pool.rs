//! Pinned host buffers kept for reuse by one GPU's staging, so a call
//! costs a lookup instead of a `cuMemHostAlloc` (which also synchronizes
//! the device), lent out as the storage of host tensors.

use std::any::Any;
use std::sync::{Arc, Mutex, PoisonError};

use crate::cuda::runtime::{context, PinnedBuffer};
use crate::tensor::HostBuffer;
use crate::Result;

/// The smallest buffer the pool allocates: smaller requests share sizes.
const MIN_BUFFER: usize = 4 << 10;

/// The size a request of `len` bytes is allocated with: the next power of
/// two (at least [`MIN_BUFFER`]), so steady-state calls of slowly varying
/// sizes find a buffer.
pub(crate) fn allocation_size(len: usize) -> usize {
    len.max(MIN_BUFFER)
        .checked_next_power_of_two()
        .unwrap_or(len)
}

/// Free pinned buffers. Buffers come back when the last tensor over them
/// is dropped, which staging only allows once no copy touching them is
/// still queued; they are kept until the pool is dropped.
#[derive(Default)]
pub(crate) struct PinnedPool {
    free: Mutex<Vec<PinnedBuffer>>,
    /// The GPU whose context is made current to free the buffers (a GPU
    /// the process already uses, not GPU 0 by default).
    device: Option<usize>,
}

impl PinnedPool {
    /// An empty pool staging for GPU `device`.
    pub(crate) fn for_device(device: usize) -> PinnedPool {
        PinnedPool {
            free: Mutex::default(),
            device: Some(device),
        }
    }

    /// A buffer of at least `len` bytes, lent until the lease is dropped:
    /// the smallest free one that fits, else a new one.
    pub(crate) fn lend(self: &Arc<Self>, len: usize) -> Result<PinnedLease> {
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
            let best = free
                .iter()
                .enumerate()
                // At most twice the size asked for: a small call does
                // not take (and so keep a large one from reusing) a large
                // buffer.
                .filter(|(_, b)| {
                    b.len() >= len && b.len() <= allocation_size(len).saturating_mul(2)
                })
                .min_by_key(|(_, b)| b.len())
                .map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        };
        let buffer = match reused {
            Some(b) => b,
            None if len == 0 => PinnedBuffer::zeros(0)?,
            None => PinnedBuffer::zeros(allocation_size(len))?,
        };
        Ok(PinnedLease {
            buffer: Some(buffer),
            len,
            pool: Arc::clone(self),
        })
    }

    /// How many free buffers the pool holds.
    #[cfg(test)]
    pub(crate) fn free_count(&self) -> usize {
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for PinnedPool {
    fn drop(&mut self) {
        // Freeing pinned memory wants a current context (any: the
        // buffers are portable): the one of the GPU staged for.
        if let Some(ctx) = self.device.and_then(|d| context(d).ok()) {
            let _ = ctx.bind();
        }
    }
}

/// The first `len` bytes of a pooled pinned buffer, returned to the pool
/// when dropped. It is the storage of a host tensor
/// ([`HostBuffer`]), so the collectives run on it like on any host tensor.
pub(crate) struct PinnedLease {
    /// Always `Some` until dropped.
    buffer: Option<PinnedBuffer>,
    len: usize,
    pool: Arc<PinnedPool>,
}

impl PinnedLease {
    fn buffer(&self) -> &PinnedBuffer {
        self.buffer
            .as_ref()
            .expect("a lease holds its buffer until dropped")
    }
}

impl HostBuffer for PinnedLease {
    fn bytes(&self) -> &[u8] {
        &self.buffer().as_slice()[..self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        let buffer = self
            .buffer
            .as_mut()
            .expect("a lease holds its buffer until dropped");
        &mut buffer.as_mut_slice()[..len]
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }

    fn holds(&self) -> String {
        format!("a pinned staging buffer of {} bytes", self.len)
    }
}

impl Drop for PinnedLease {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            if !buffer.is_empty() {
                self.pool
                    .free
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(buffer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_sizes_round_up_to_powers_of_two() {
        assert_eq!(allocation_size(0), MIN_BUFFER);
        assert_eq!(allocation_size(1), MIN_BUFFER);
        assert_eq!(allocation_size(MIN_BUFFER + 1), 2 * MIN_BUFFER);
        assert_eq!(allocation_size(256 << 20), 256 << 20);
        assert_eq!(allocation_size((256 << 20) + 1), 512 << 20);
    }

    #[test]
    fn leases_go_back_to_the_pool_and_are_reused() {
        let pool = Arc::new(PinnedPool::default());
        let lease = match pool.lend(100) {
            Ok(l) => l,
            Err(crate::Error::NoCuda { reason }) => {
                crate::test_skipped(format!("pinned memory needs a CUDA driver ({reason})"));
                return;
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(lease.bytes().len(), 100);
        drop(lease);
        assert_eq!(pool.free_count(), 1);
        let again = pool.lend(MIN_BUFFER).unwrap();
        assert_eq!(pool.free_count(), 0);
        assert_eq!(again.bytes().len(), MIN_BUFFER);
    }
}
