//! What a link's shared-memory segment holds, byte by byte.
//!
//! ```text
//! offset 0                 Header (HEADER_SIZE bytes, one page)
//!   ident      magic, version, header size, ring capacity, total size
//!   sides[0]   the lower rank:  pid, attached, closed
//!   sides[1]   the higher rank: pid, attached, closed
//!   rings[0]   lower -> higher: head, tail, data and space signals
//!   rings[1]   higher -> lower: the same          (each on its own cache line)
//! HEADER_SIZE              data of ring 0 (capacity bytes)
//! HEADER_SIZE + capacity   data of ring 1 (capacity bytes)
//! ```
//!
//! Every header field is an atomic, so both processes may hold `&Header` at
//! once. The creator fills the header and stores `magic` last (Release); an
//! opener loads `magic` first (Acquire) before trusting anything else.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::signal::Signal;
use crate::{Error, Result};

/// "TCSHMSEG" in little-endian: the first eight bytes of every segment.
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"TCSHMSEG");
/// Bumped whenever this layout changes (2: the rings' signals).
pub(super) const VERSION: u32 = 2;
/// Bytes before the first ring's data: one page, so data starts aligned.
pub(super) const HEADER_SIZE: usize = 4096;

/// Keeps a value on its own cache line (128 bytes: adjacent-line
/// prefetchers on x86 pull pairs of 64-byte lines).
#[repr(C, align(128))]
#[derive(Default)]
pub(crate) struct CachePadded<T>(pub T);

/// The two counters of one single-producer single-consumer ring, and the
/// signals a side that waits long sleeps on.
#[repr(C)]
#[derive(Default)]
pub(crate) struct RingControl {
    /// Bytes ever written; only the producer stores it.
    pub head: CachePadded<AtomicU64>,
    /// Bytes ever read; only the consumer stores it.
    pub tail: CachePadded<AtomicU64>,
    /// Raised by the producer after `head` moves (and on close): a
    /// consumer waiting for data sleeps on it.
    pub data: CachePadded<Signal>,
    /// Raised by the consumer after `tail` moves (and on close): a
    /// producer waiting for space sleeps on it.
    pub space: CachePadded<Signal>,
}

/// What identifies a segment and its geometry.
#[repr(C)]
pub(super) struct Ident {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub header_size: AtomicU32,
    pub capacity: AtomicU64,
    pub total_size: AtomicU64,
}

/// One rank's state, written by that rank and read by its peer.
#[repr(C)]
pub(super) struct Side {
    /// The process id, for error messages.
    pub pid: AtomicU32,
    /// Nonzero once this side has mapped the segment.
    pub attached: AtomicU32,
    /// Nonzero once this side dropped its link.
    pub closed: AtomicU32,
}

/// The first page of a segment.
#[repr(C)]
pub(super) struct Header {
    pub ident: CachePadded<Ident>,
    pub sides: [CachePadded<Side>; 2],
    pub rings: [RingControl; 2],
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_SIZE);
const _: () = assert!(HEADER_SIZE.is_multiple_of(std::mem::align_of::<Header>()));

/// The size of a segment whose two rings hold `capacity` bytes each, or
/// `None` if that overflows.
pub(super) fn total_size(capacity: usize) -> Option<usize> {
    capacity.checked_mul(2)?.checked_add(HEADER_SIZE)
}

/// Where ring `index`'s data starts, from the start of the segment.
pub(super) fn data_offset(index: usize, capacity: usize) -> usize {
    HEADER_SIZE + index * capacity
}

impl Header {
    /// Fills a zeroed header as its creator (the lower rank, side 0), then
    /// publishes it by storing the magic.
    pub fn init(&self, capacity: usize, pid: u32) {
        let ident = &self.ident.0;
        ident.version.store(VERSION, Ordering::Relaxed);
        ident
            .header_size
            .store(HEADER_SIZE as u32, Ordering::Relaxed);
        ident.capacity.store(capacity as u64, Ordering::Relaxed);
        let total = total_size(capacity).unwrap_or(usize::MAX) as u64;
        ident.total_size.store(total, Ordering::Relaxed);
        self.sides[0].0.pid.store(pid, Ordering::Relaxed);
        self.sides[0].0.attached.store(1, Ordering::Relaxed);
        ident.magic.store(MAGIC, Ordering::Release);
    }

    /// Checks that this header is one this build can use with rings of
    /// `capacity` bytes in a segment of `file_size` bytes.
    pub fn validate(&self, segment: &str, capacity: usize, file_size: u64) -> Result<()> {
        let ident = &self.ident.0;
        let bad = |field: &str, expected: String, found: String| Error::ShmBadHeader {
            segment: segment.to_string(),
            field: field.to_string(),
            expected,
            found,
        };
        let magic = ident.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(bad(
                "magic",
                format!("{MAGIC:#018x}"),
                format!("{magic:#018x}"),
            ));
        }
        let version = ident.version.load(Ordering::Relaxed);
        if version != VERSION {
            return Err(bad("version", VERSION.to_string(), version.to_string()));
        }
        let header_size = ident.header_size.load(Ordering::Relaxed);
        if header_size as usize != HEADER_SIZE {
            return Err(bad(
                "header size",
                HEADER_SIZE.to_string(),
                header_size.to_string(),
            ));
        }
        let found_capacity = ident.capacity.load(Ordering::Relaxed);
        if found_capacity != capacity as u64 {
            return Err(bad(
                "ring capacity (as passed to connect by this rank)",
                capacity.to_string(),
                found_capacity.to_string(),
            ));
        }
        let total = ident.total_size.load(Ordering::Relaxed);
        let expected_total = total_size(capacity).unwrap_or(usize::MAX) as u64;
        if total != expected_total || file_size != expected_total {
            return Err(bad(
                "total size (header field and file size)",
                expected_total.to_string(),
                format!("{total} and {file_size}"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zeroed() -> Box<Header> {
        Box::new(Header {
            ident: CachePadded(Ident {
                magic: AtomicU64::new(0),
                version: AtomicU32::new(0),
                header_size: AtomicU32::new(0),
                capacity: AtomicU64::new(0),
                total_size: AtomicU64::new(0),
            }),
            sides: std::array::from_fn(|_| {
                CachePadded(Side {
                    pid: AtomicU32::new(0),
                    attached: AtomicU32::new(0),
                    closed: AtomicU32::new(0),
                })
            }),
            rings: Default::default(),
        })
    }

    #[test]
    fn counters_sit_on_separate_cache_lines() {
        let h = zeroed();
        let addr = |p: &AtomicU64| p as *const AtomicU64 as usize;
        let lines: Vec<usize> = h
            .rings
            .iter()
            .flat_map(|r| [addr(&r.head.0) / 128, addr(&r.tail.0) / 128])
            .collect();
        for (i, a) in lines.iter().enumerate() {
            assert!(!lines[i + 1..].contains(a), "lines {lines:?}");
        }
    }

    #[test]
    fn initialised_header_validates() {
        let h = zeroed();
        h.init(1000, 42);
        let total = total_size(1000).unwrap() as u64;
        h.validate("seg", 1000, total).unwrap();
        assert_eq!(h.sides[0].0.pid.load(Ordering::Relaxed), 42);
        assert_eq!(data_offset(1, 1000), HEADER_SIZE + 1000);
    }

    #[test]
    fn bad_headers_say_expected_and_found() {
        let h = zeroed();
        let total = total_size(1000).unwrap() as u64;
        let err = h.validate("seg", 1000, total).unwrap_err().to_string();
        assert!(err.contains("expected magic 0x") && err.contains("found 0x0000000000000000"));

        h.init(1000, 1);
        h.ident.0.version.store(VERSION + 1, Ordering::Relaxed);
        let err = h.validate("seg", 1000, total).unwrap_err();
        match err {
            Error::ShmBadHeader {
                field,
                expected,
                found,
                ..
            } => {
                assert_eq!(field, "version");
                assert_eq!(expected, VERSION.to_string());
                assert_eq!(found, (VERSION + 1).to_string());
            }
            other => panic!("unexpected {other}"),
        }

        h.ident.0.version.store(VERSION, Ordering::Relaxed);
        let err = h.validate("seg", 2000, total).unwrap_err().to_string();
        assert!(err.contains("expected ring capacity") && err.contains("2000, found 1000"));

        let err = h.validate("seg", 1000, total - 1).unwrap_err().to_string();
        assert!(err.contains("total size"), "{err}");
    }
}
