//! [`SymmetricMemory`]: host memory that the ranks of a group on one host
//! allocate together, each rank owning one region of the same size that
//! every other rank can read, like PyTorch's symmetric memory on GPUs.
//!
//! An all-reduce on a tensor in it needs no staging: each rank reduces its
//! share straight out of the others' regions, and copies the others'
//! reduced shares straight out of theirs (`cpu::algorithms::shm_symmetric`).
//!
//! One segment holds every rank's region, page aligned, set up through the
//! group's store (`group_segment.rs`: unlinked once mapped, its pages
//! reserved up front). [`SymmetricRegistry`] remembers a group's live
//! allocations, so a collective can tell whether a tensor's bytes lie in
//! one and where.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use super::group_segment::{connect_group_segment, Purpose};
use super::segment::Segment;
use crate::store::Store;
use crate::tensor::HostBuffer;
use crate::{Error, Result};

/// Regions start on page boundaries (and so on cache lines).
const REGION_ALIGN: usize = 4096;

/// One symmetric allocation of a group: `len` bytes per rank (see the
/// module docs).
pub struct SymmetricMemory {
    id: u64,
    rank: usize,
    world_size: usize,
    len: usize,
    /// Bytes from one region's start to the next (`len`, page aligned).
    stride: usize,
    segment: Segment,
}

impl std::fmt::Debug for SymmetricMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricMemory")
            .field("id", &self.id)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("len", &self.len)
            .finish()
    }
}

impl SymmetricMemory {
    /// Allocation number `id` of the group whose ranks meet under
    /// `key_prefix`: every rank calls it with the same `id` and `len`
    /// (zero-filled bytes per rank). One rank asking for another size
    /// fails every rank with [`Error::CollectiveMismatch`] naming both
    /// sizes; waiting for the others ends after `timeout`.
    pub fn connect(
        store: &dyn Store,
        key_prefix: &str,
        id: u64,
        (rank, world_size): (usize, usize),
        len: usize,
        timeout: Duration,
    ) -> Result<SymmetricMemory> {
        let stride = len
            .checked_next_multiple_of(REGION_ALIGN)
            .map(|n| n.max(REGION_ALIGN));
        let total = stride
            .and_then(|s| s.checked_mul(world_size))
            .filter(|&n| rank < world_size && n <= isize::MAX as usize);
        let (Some(stride), Some(total)) = (stride, total) else {
            return Err(Error::InvalidArgument(format!(
                "symmetric memory: expected rank < world size and at most {} bytes in all, found rank {rank} of {world_size} ranks asking {len} bytes each",
                isize::MAX
            )));
        };
        let purpose = Purpose {
            tag: "sym",
            what: "symmetric allocation",
            asked: len,
            asked_means: &|n| format!("{n} bytes per rank"),
        };
        let key = format!("{key_prefix}/symmetric/{id}");
        let segment =
            connect_group_segment(store, &key, (rank, world_size), total, &purpose, timeout)?;
        Ok(SymmetricMemory {
            id,
            rank,
            world_size,
            len,
            stride,
            segment,
        })
    }

    /// The allocation's number within its group.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Bytes per rank.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether each rank's region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The number of ranks sharing it.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    fn region(&self, rank: usize) -> *mut u8 {
        assert!(rank < self.world_size, "rank {rank} of {}", self.world_size);
        // SAFETY: `rank * stride` lies inside the mapping, which is
        // `world_size * stride` bytes long.
        unsafe { self.segment.base().as_ptr().add(rank * self.stride) }
    }

    /// Where `bytes` start within this rank's region, if they lie wholly
    /// inside it.
    pub fn offset_of(&self, bytes: &[u8]) -> Option<usize> {
        let start = (bytes.as_ptr() as usize).checked_sub(self.region(self.rank) as usize)?;
        (start + bytes.len() <= self.len).then_some(start)
    }

    /// `range` of `rank`'s region.
    ///
    /// # Safety
    /// Nobody may write those bytes while the slice lives (the algorithm's
    /// protocol orders every write of a region before the others read it).
    pub(crate) unsafe fn peer_bytes(&self, rank: usize, range: std::ops::Range<usize>) -> &[u8] {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "symmetric read out of bounds: {range:?} of {} bytes",
            self.len
        );
        // SAFETY: inside the region (checked), alive as long as self; the
        // caller guarantees nobody writes it meanwhile.
        unsafe { std::slice::from_raw_parts(self.region(rank).add(range.start), range.len()) }
    }
}

/// This rank's region of a [`SymmetricMemory`], as a tensor's storage.
pub(crate) struct SymmetricRegion(Arc<SymmetricMemory>);

impl HostBuffer for SymmetricRegion {
    fn bytes(&self) -> &[u8] {
        let m = &self.0;
        // SAFETY: this rank's region, `len` bytes inside the mapping, which
        // lives as long as self; only this rank writes it, through the one
        // SymmetricRegion made for it (the others only read it).
        unsafe { std::slice::from_raw_parts(m.region(m.rank), m.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let m = &self.0;
        // SAFETY: as in `bytes`; `&mut self` makes this the only access
        // from this process.
        unsafe { std::slice::from_raw_parts_mut(m.region(m.rank), m.len) }
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }

    fn holds(&self) -> String {
        format!(
            "symmetric shared memory (allocation {} of its group), not a Vec",
            self.0.id
        )
    }
}

/// A group's live symmetric allocations (see the module docs).
#[derive(Debug, Default)]
pub struct SymmetricRegistry {
    next_id: AtomicU64,
    live: Mutex<Vec<Weak<SymmetricMemory>>>,
}

impl SymmetricRegistry {
    /// Allocates the group's next symmetric memory of `len` bytes per rank
    /// (collective: every rank of the group calls it, in the same order
    /// with the same `len`) and returns this rank's region as a tensor's
    /// storage.
    pub(crate) fn allocate(
        &self,
        store: &dyn Store,
        key_prefix: &str,
        (rank, world_size): (usize, usize),
        len: usize,
        timeout: Duration,
    ) -> Result<Box<dyn HostBuffer>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let memory = Arc::new(SymmetricMemory::connect(
            store,
            key_prefix,
            id,
            (rank, world_size),
            len,
            timeout,
        )?);
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&memory));
        Ok(Box::new(SymmetricRegion(memory)))
    }

    /// The live allocation holding all of `bytes` in this rank's region,
    /// and where they start in it.
    pub fn find(&self, bytes: &[u8]) -> Option<(Arc<SymmetricMemory>, usize)> {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.iter().filter_map(Weak::upgrade).find_map(|m| {
            let offset = m.offset_of(bytes)?;
            Some((m, offset))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HashStore;

    fn allocate_on(world: usize, lens: &[usize]) -> Vec<Result<Box<dyn HostBuffer>>> {
        let store = Arc::new(HashStore::new());
        let registries: Vec<SymmetricRegistry> = (0..world).map(|_| Default::default()).collect();
        std::thread::scope(|s| {
            let hs: Vec<_> = registries
                .iter()
                .enumerate()
                .map(|(rank, registry)| {
                    let store = store.clone();
                    let len = lens[rank];
                    s.spawn(move || {
                        registry.allocate(&*store, "g", (rank, world), len, Duration::from_secs(10))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn every_rank_reads_the_others_regions_and_finds_its_own_views() {
        let store = Arc::new(HashStore::new());
        let world = 3;
        let registries: Vec<SymmetricRegistry> = (0..world).map(|_| Default::default()).collect();
        let mut regions: Vec<Box<dyn HostBuffer>> = std::thread::scope(|s| {
            let hs: Vec<_> = registries
                .iter()
                .enumerate()
                .map(|(rank, registry)| {
                    let store = store.clone();
                    s.spawn(move || {
                        registry
                            .allocate(&*store, "g", (rank, world), 5000, Duration::from_secs(10))
                            .unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(store.num_keys().unwrap(), 0, "setup keys left behind");
        for (rank, region) in regions.iter_mut().enumerate() {
            assert!(region.bytes().iter().all(|&b| b == 0), "not zero-filled");
            region.bytes_mut().fill(rank as u8 + 1);
        }
        for (rank, registry) in registries.iter().enumerate() {
            let own = regions[rank].bytes();
            let (memory, offset) = registry.find(&own[100..200]).expect("a view of the region");
            assert_eq!((offset, memory.id(), memory.len()), (100, 0, 5000));
            for peer in 0..world {
                // SAFETY: nobody writes the regions any more.
                let theirs = unsafe { memory.peer_bytes(peer, 4990..5000) };
                assert_eq!(theirs, [peer as u8 + 1; 10]);
            }
            assert!(registry.find(&[0u8; 8]).is_none(), "private memory found");
        }
        drop(regions);
        assert!(registries[0].find(&[0u8; 8]).is_none());
    }

    #[test]
    fn ranks_asking_different_sizes_fail_naming_both() {
        let outcomes = allocate_on(2, &[4096, 8192]);
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                Err(Error::CollectiveMismatch { mine, theirs, .. }) => assert!(
                    mine.contains(&format!("{} bytes per rank", 4096 * (rank + 1)))
                        && theirs.contains(&format!("{} bytes per rank", 4096 * (2 - rank))),
                    "rank {rank}: {mine} / {theirs}"
                ),
                Err(other) => panic!("rank {rank}: expected a size mismatch, found {other:?}"),
                Ok(_) => panic!("rank {rank}: expected a size mismatch, found an allocation"),
            }
        }
    }

    #[test]
    fn empty_regions_are_allowed() {
        for outcome in allocate_on(2, &[0, 0]) {
            assert!(outcome.expect("empty allocation").bytes().is_empty());
        }
    }
}
