//! [`Scratch`]: the byte buffers collectives stage tensors in, kept by the
//! thread that ran the collective for the next one.
//!
//! A fresh allocation of tens of MiB comes from the kernel as untouched
//! pages, and the first write to each costs a page fault: at 32 MiB and up
//! (where the allocator maps every such buffer anew) that took longer than
//! moving the data (a 2-rank all_gather went from 2.7 ms at 8 MiB to 24.6
//! ms at 32 MiB). Reused buffers are already mapped; they are zeroed, as a
//! fresh one would be. A thread keeps at most [`KEPT`] buffers of at most
//! [`KEPT_MAX_BYTES`] each.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

/// Buffers a thread keeps between collectives.
const KEPT: usize = 4;

/// Larger buffers are freed when dropped rather than kept.
const KEPT_MAX_BYTES: usize = 256 << 20;

thread_local! {
    static POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A byte buffer, returned to this thread's pool when dropped.
pub(super) struct Scratch {
    buf: Vec<u8>,
}

/// A buffer of `len` zero bytes, reusing one this thread kept if any.
pub(super) fn zeroed(len: usize) -> Scratch {
    let mut out = empty(len);
    out.buf.resize(len, 0);
    out
}

/// An empty buffer with room for `capacity` bytes, reusing one this
/// thread kept if any: for a caller that fills it with
/// [`Scratch::extend_from_slice`] (one pass over the bytes, where zeroing
/// first would be two).
pub(super) fn empty(capacity: usize) -> Scratch {
    let kept = POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        // The smallest kept buffer that fits, else the largest (to grow).
        let fits = (0..pool.len())
            .filter(|&i| pool[i].capacity() >= capacity)
            .min_by_key(|&i| pool[i].capacity());
        let pick = fits.or_else(|| (0..pool.len()).max_by_key(|&i| pool[i].capacity()));
        pick.map(|i| pool.swap_remove(i))
    });
    let buf = match kept {
        Some(mut buf) => {
            buf.clear();
            buf.reserve(capacity);
            buf
        }
        None => Vec::with_capacity(capacity),
    };
    Scratch { buf }
}

impl Scratch {
    /// Appends `bytes`.
    pub(super) fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }
}

impl Deref for Scratch {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if buf.capacity() == 0 || buf.capacity() > KEPT_MAX_BYTES {
            return;
        }
        // A thread being torn down has no pool left: the buffer is freed.
        let _ = POOL.try_with(|pool| {
            let mut pool = pool.borrow_mut();
            pool.push(buf);
            if pool.len() > KEPT {
                // Keep the largest ones.
                let smallest = (0..pool.len()).min_by_key(|&i| pool[i].capacity());
                if let Some(i) = smallest {
                    pool.swap_remove(i);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_zeroed_and_reused() {
        let ptr = {
            let mut a = zeroed(1 << 20);
            a.fill(7);
            a.as_ptr()
        };
        let b = zeroed(1000);
        assert_eq!(b.len(), 1000);
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(b.as_ptr(), ptr, "the kept buffer is reused");
        // Two at once are two buffers.
        let c = zeroed(10);
        assert_ne!(c.as_ptr(), b.as_ptr());
    }

    #[test]
    fn an_empty_buffer_is_filled_by_appending_and_reused() {
        std::thread::spawn(|| {
            let ptr = {
                let mut a = zeroed(4096);
                a.fill(9);
                a.as_ptr()
            };
            let mut b = empty(100);
            assert_eq!(b.len(), 0);
            b.extend_from_slice(&[1, 2, 3]);
            assert_eq!(&b[..], &[1, 2, 3]);
            assert_eq!(b.as_ptr(), ptr, "the kept buffer is reused");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_keeps_at_most_a_few_buffers_and_no_huge_ones() {
        std::thread::spawn(|| {
            let many: Vec<Scratch> = (1..=KEPT + 3).map(|k| zeroed(k * 4096)).collect();
            drop(many);
            POOL.with(|p| assert_eq!(p.borrow().len(), KEPT));
            drop(zeroed(KEPT_MAX_BYTES + 1));
            POOL.with(|p| {
                let p = p.borrow();
                assert!(p.iter().all(|b| b.capacity() <= KEPT_MAX_BYTES));
            });
        })
        .join()
        .unwrap();
    }
}
