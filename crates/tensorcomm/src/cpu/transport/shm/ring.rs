//! A single-producer single-consumer byte ring over shared memory.
//!
//! `head` counts bytes ever written and `tail` bytes ever read; both only
//! grow (64-bit counters do not wrap in practice), so `head - tail` is the
//! number of readable bytes and the position of byte `n` is `n % capacity`.
//! The producer copies data in, then publishes it with a Release store of
//! `head`; the consumer's Acquire load of `head` makes those bytes visible.
//! Symmetrically, the consumer releases space with a Release store of
//! `tail` after copying out. A copy that crosses the end of the data area is
//! split in two.
//!
//! Memory safety never depends on the peer: the counters it writes are
//! clamped so that no copy leaves the data area, whatever they hold.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use super::layout::RingControl;

/// One end of a ring: [`Ring::write`] for the producer, [`Ring::read`] for
/// the consumer.
pub(super) struct Ring {
    ctl: NonNull<RingControl>,
    data: NonNull<u8>,
    capacity: usize,
}

// SAFETY: a Ring only holds pointers into memory that `Ring::new`'s caller
// keeps valid for the Ring's lifetime; the shared counters are atomics and
// `write`/`read` take `&mut self`, so one Ring value is never used by two
// threads at once.
unsafe impl Send for Ring {}

impl Ring {
    /// # Safety
    /// `ctl` must point to a `RingControl` and `data` to `capacity` bytes
    /// (`capacity > 0`), both valid until this Ring is dropped. Among all
    /// Rings over the same memory (in any process), at most one may call
    /// `write` and at most one may call `read`.
    pub unsafe fn new(ctl: NonNull<RingControl>, data: NonNull<u8>, capacity: usize) -> Ring {
        debug_assert!(capacity > 0);
        Ring {
            ctl,
            data,
            capacity,
        }
    }

    fn ctl(&self) -> &RingControl {
        // SAFETY: `new`'s contract keeps the control block valid while self
        // lives, and it is made of atomics, so shared references are fine.
        unsafe { self.ctl.as_ref() }
    }

    /// Copies as much of `src` as fits now; returns the bytes written.
    pub fn write(&mut self, src: &[u8]) -> usize {
        let ctl = self.ctl();
        let head = ctl.head.0.load(Ordering::Relaxed);
        let tail = ctl.tail.0.load(Ordering::Acquire);
        let cap = self.capacity as u64;
        let used = head.wrapping_sub(tail).min(cap);
        let n = (cap - used).min(src.len() as u64) as usize;
        if n == 0 {
            return 0;
        }
        let pos = (head % cap) as usize;
        let first = n.min(self.capacity - pos);
        // SAFETY: pos + first <= capacity and n - first <= pos (n <=
        // capacity), so both copies stay inside the `capacity` bytes that
        // `new`'s contract keeps valid. The range [head, head + n) is free
        // space the consumer does not read until we publish `head` below
        // (Release). `src` is caller memory, distinct from the data area.
        unsafe {
            let dst = self.data.as_ptr();
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst.add(pos), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), dst, n - first);
        }
        ctl.head
            .0
            .store(head.wrapping_add(n as u64), Ordering::Release);
        ctl.data.0.notify();
        n
    }

    /// Copies as many readable bytes as fit into `dst`; returns how many.
    pub fn read(&mut self, dst: &mut [u8]) -> usize {
        let ctl = self.ctl();
        let tail = ctl.tail.0.load(Ordering::Relaxed);
        let head = ctl.head.0.load(Ordering::Acquire);
        let cap = self.capacity as u64;
        let avail = head.wrapping_sub(tail).min(cap);
        let n = avail.min(dst.len() as u64) as usize;
        if n == 0 {
            return 0;
        }
        let pos = (tail % cap) as usize;
        let first = n.min(self.capacity - pos);
        // SAFETY: as in `write`, both copies stay inside the data area
        // (n <= capacity). The bytes [tail, tail + n) were published by the
        // producer's Release store of `head`, which our Acquire load saw,
        // and it does not overwrite them until we advance `tail` below.
        unsafe {
            let src = self.data.as_ptr();
            std::ptr::copy_nonoverlapping(src.add(pos), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr().add(first), n - first);
        }
        ctl.tail
            .0
            .store(tail.wrapping_add(n as u64), Ordering::Release);
        ctl.space.0.notify();
        n
    }

    /// Bytes the consumer could read now.
    pub fn readable(&self) -> u64 {
        let ctl = self.ctl();
        let head = ctl.head.0.load(Ordering::Acquire);
        head.wrapping_sub(ctl.tail.0.load(Ordering::Relaxed))
    }

    /// Bytes the producer could write now.
    fn writable(&self) -> u64 {
        let ctl = self.ctl();
        let used = ctl
            .head
            .0
            .load(Ordering::Relaxed)
            .wrapping_sub(ctl.tail.0.load(Ordering::Acquire));
        (self.capacity as u64).saturating_sub(used)
    }

    /// As the consumer: sleeps up to `timeout` unless data is there or
    /// `stop()` holds; returns early when the producer writes (or the
    /// ring is woken, as on close).
    pub fn sleep_for_data(&self, stop: impl Fn() -> bool, timeout: std::time::Duration) {
        let ready = || self.readable() > 0 || stop();
        self.ctl().data.0.sleep_unless(ready, timeout);
    }

    /// As the producer: sleeps up to `timeout` unless there is space or
    /// `stop()` holds; returns early when the consumer reads (or the ring
    /// is woken).
    pub fn sleep_for_space(&self, stop: impl Fn() -> bool, timeout: std::time::Duration) {
        let ready = || self.writable() > 0 || stop();
        self.ctl().space.0.sleep_unless(ready, timeout);
    }
}

/// Wakes every thread sleeping on `ctl`'s signals (a side closing its
/// link: the others must look again).
pub(super) fn wake_all(ctl: &RingControl) {
    ctl.data.0.notify();
    ctl.space.0.notify();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Heap memory laid out like one ring of a segment.
    struct Memory {
        ctl: Box<RingControl>,
        data: Box<[std::cell::UnsafeCell<u8>]>,
    }

    // SAFETY: the test memory is only reached through Rings, which follow
    // the single-producer single-consumer protocol.
    unsafe impl Sync for Memory {}
    // SAFETY: as above; the boxes own plain memory.
    unsafe impl Send for Memory {}

    impl Memory {
        fn new(capacity: usize) -> Arc<Memory> {
            Arc::new(Memory {
                ctl: Box::default(),
                data: (0..capacity)
                    .map(|_| std::cell::UnsafeCell::new(0))
                    .collect(),
            })
        }

        fn ring(&self) -> Ring {
            let ctl = NonNull::from(&*self.ctl);
            let data = NonNull::new(self.data[0].get()).unwrap();
            // SAFETY: the caller keeps the Arc<Memory> alive beside the
            // Ring, and each test uses one Ring to write and one to read.
            unsafe { Ring::new(ctl, data, self.data.len()) }
        }
    }

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    #[test]
    fn full_and_empty_rings_move_nothing() {
        let mem = Memory::new(10);
        let (mut w, mut r) = (mem.ring(), mem.ring());
        let mut buf = [0u8; 16];
        assert_eq!(r.read(&mut buf), 0);
        assert_eq!(w.write(&[1; 16]), 10);
        assert_eq!(w.write(&[2; 4]), 0);
        assert_eq!(r.read(&mut buf[..3]), 3);
        assert_eq!(w.write(&[3, 4, 5, 6]), 3); // wraps: 3 bytes free
        assert_eq!(r.read(&mut buf), 10);
        assert_eq!(&buf[..10], &[1, 1, 1, 1, 1, 1, 1, 3, 4, 5]);
        assert_eq!(r.read(&mut buf), 0);
    }

    #[test]
    fn corrupt_counters_cannot_overflow_the_data_area() {
        let mem = Memory::new(8);
        mem.ctl.head.0.store(1000, Ordering::Relaxed); // peer wrote garbage
        let mut r = mem.ring();
        let mut buf = [0u8; 64];
        assert_eq!(r.read(&mut buf), 8);
        let mut w = mem.ring();
        mem.ctl.tail.0.store(5000, Ordering::Relaxed);
        assert!(w.write(&[0; 64]) <= 8);
    }

    #[test]
    fn random_sizes_wrap_around_across_threads() {
        const TOTAL: usize = 3_000_000;
        let mem = Memory::new(997); // prime, so wraps land everywhere
        let mut w = mem.ring();
        let mut r = mem.ring();
        let keep = mem.clone();
        let producer = std::thread::spawn(move || {
            let _keep = keep;
            let mut rng = Rng(7);
            let data: Vec<u8> = (0..TOTAL).map(|_| rng.next() as u8).collect();
            let mut sent = 0;
            while sent < TOTAL {
                let want = (rng.next() % 3000) as usize + 1;
                let end = (sent + want).min(TOTAL);
                match w.write(&data[sent..end]) {
                    0 => std::thread::yield_now(),
                    n => sent += n,
                }
            }
            data.iter()
                .fold(0u64, |h, &b| h.wrapping_mul(31).wrapping_add(b as u64))
        });
        let mut rng = Rng(99);
        let mut got = Vec::with_capacity(TOTAL);
        let mut buf = vec![0u8; 3000];
        while got.len() < TOTAL {
            let want = (rng.next() % 3000) as usize + 1;
            let n = r.read(&mut buf[..want]);
            if n == 0 {
                std::thread::yield_now();
            }
            got.extend_from_slice(&buf[..n]);
        }
        let sent_hash = producer.join().unwrap();
        let got_hash = got
            .iter()
            .fold(0u64, |h, &b| h.wrapping_mul(31).wrapping_add(b as u64));
        assert_eq!(got_hash, sent_hash);
        let mut check = Rng(7);
        assert!(got.iter().all(|&b| b == check.next() as u8));
    }
}
