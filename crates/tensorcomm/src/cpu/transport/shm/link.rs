//! [`ShmLink`]: a bidirectional byte pipe between two ranks of one host.

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::layout::{data_offset, total_size, Header, HEADER_SIZE};
use super::ring::{wake_all, Ring};
use super::segment::{self, Segment};
use super::wait::{Backoff, ShmWait};
use crate::store::Store;
use crate::{Error, Result};

/// How often a blocked call asks the kernel whether the peer process still
/// holds its lock on the segment (the closed flag is checked every time).
const PROBE_EVERY: Duration = Duration::from_millis(5);

/// A bidirectional byte pipe between this rank and one peer on the same
/// host, through a shared-memory segment holding one ring per direction.
///
/// Bytes arrive in order and exactly once; there are no message
/// boundaries, so both sides agree on sizes (as with a TCP stream). `send`
/// and `recv` block until done: they spin (~50 µs, or ~5 µs with
/// [`ShmWait::Sleep`]: see [`set_wait`](Self::set_wait)), then yield until
/// ~2 ms have passed, then sleep on the ring's futex, which the peer's
/// next write (or read) wakes; `try_send_some` and `try_recv_some` never
/// block. Concurrent sends (or recvs) from several threads are
/// serialised, never interleaved.
/// A call blocked on a peer that drops its link or whose process exits
/// fails within a few milliseconds with [`Error::PeerClosed`]; one that
/// reaches its deadline fails with [`Error::PeerTimeout`].
///
/// ```
/// use std::{sync::Arc, thread, time::{Duration, Instant}};
/// use tensorcomm::cpu::transport::shm::{ShmLink, ShmWait};
/// use tensorcomm::store::HashStore;
///
/// let store = Arc::new(HashStore::new());
/// let s = store.clone();
/// let peer = thread::spawn(move || -> tensorcomm::Result<()> {
///     let link = ShmLink::connect(&*s, "job", 1, 0, 1 << 16, Duration::from_secs(10))?;
///     let deadline = Instant::now() + Duration::from_secs(10);
///     let mut buf = [0u8; 5];
///     link.recv(&mut buf, deadline)?;
///     link.send(&buf.map(|b| b.to_ascii_uppercase()), deadline)
/// });
/// let mut link = ShmLink::connect(&*store, "job", 0, 1, 1 << 16, Duration::from_secs(10))?;
/// // This side spins ~5 µs, yields until ~2 ms, then sleeps on the ring's futex.
/// link.set_wait(ShmWait::Sleep);
/// assert_eq!(link.wait(), ShmWait::Sleep);
/// let deadline = Instant::now() + Duration::from_secs(10);
/// link.send(b"hello", deadline)?;
/// let mut reply = [0u8; 5];
/// link.recv(&mut reply, deadline)?;
/// assert_eq!(&reply, b"HELLO");
/// assert_eq!(link.peer_rank(), 1);
/// peer.join().unwrap()?;
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct ShmLink {
    side: usize,
    my_rank: usize,
    peer_rank: usize,
    peer_pid: u32,
    capacity: usize,
    /// Largest piece a blocking call moves at once, so that the peer can
    /// copy one piece while this side copies the next.
    chunk: usize,
    tx: Mutex<Ring>,
    rx: Mutex<Ring>,
    /// How blocked calls wait: `Spin` or `Sleep`, never `Auto`.
    wait: ShmWait,
    /// Tests only: blocked `send`s and `recv`s sleep this long on the
    /// ring's signal right after the spin, without yielding first, so
    /// that a lost wake-up stalls them for that long (`link/wait_tests.rs`).
    #[cfg(test)]
    test_sleep: Option<Duration>,
    epoch: Instant,
    next_probe_ns: AtomicU64,
    /// Last, so the rings' pointers never outlive the mapping.
    segment: Segment,
}

/// A segment name no other live segment has: pid, a per-process sequence
/// number and the clock (in case an earlier process with our pid crashed
/// while creating a segment), then the two ranks.
fn segment_name(lo: usize, hi: usize) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("/tcshm.{}.{seq}.{nanos:08x}.{lo}-{hi}", std::process::id())
}

/// The header at the start of `segment`, which must be at least
/// `HEADER_SIZE` bytes long.
fn header_of(segment: &Segment) -> &Header {
    debug_assert!(segment.len() >= HEADER_SIZE);
    // SAFETY: the mapping is page aligned (enough for Header's alignment)
    // and at least HEADER_SIZE >= size_of::<Header>() bytes long; Header is
    // all atomics, valid for any bit pattern including the zeroes of a
    // fresh segment, and lives as long as the borrowed segment.
    unsafe { segment.base().cast::<Header>().as_ref() }
}

impl ShmLink {
    /// Connects this rank to `peer_rank` on the same host. Both ranks call
    /// it with the same `key_prefix` and `capacity` (bytes per direction;
    /// [`DEFAULT_CAPACITY`](super::DEFAULT_CAPACITY) is a good default).
    ///
    /// The lower rank creates the segment and publishes its name under
    /// `{key_prefix}/shm/{lo}-{hi}`; the higher rank maps it, unlinks the
    /// name (so nothing is left in `/dev/shm` whatever happens later) and
    /// marks itself attached; the lower rank returns once it sees that and
    /// deletes the key. Waiting for the peer ends after `timeout` with
    /// [`Error::PeerTimeout`] (lower rank) or [`Error::StoreTimeout`]
    /// (higher rank). A segment with a foreign header or another capacity
    /// gives [`Error::ShmBadHeader`] saying what was expected and found.
    pub fn connect(
        store: &dyn Store,
        key_prefix: &str,
        my_rank: usize,
        peer_rank: usize,
        capacity: usize,
        timeout: Duration,
    ) -> Result<ShmLink> {
        if my_rank == peer_rank {
            return Err(Error::InvalidArgument(format!(
                "ShmLink::connect expected a peer rank other than this rank, found {peer_rank} for both"
            )));
        }
        if capacity == 0 || capacity > isize::MAX as usize / 4 {
            return Err(Error::InvalidArgument(format!(
                "ShmLink::connect expected a ring capacity between 1 and {} bytes, found {capacity}",
                isize::MAX as usize / 4
            )));
        }
        let start = Instant::now();
        let deadline = start
            .checked_add(timeout)
            .unwrap_or(start + Duration::from_secs(1 << 32));
        let (lo, hi) = (my_rank.min(peer_rank), my_rank.max(peer_rank));
        let key = format!("{key_prefix}/shm/{lo}-{hi}");
        if my_rank == lo {
            Self::create_side(store, &key, lo, hi, capacity, start, deadline)
        } else {
            Self::open_side(store, &key, lo, hi, capacity, start, deadline)
        }
    }

    fn create_side(
        store: &dyn Store,
        key: &str,
        lo: usize,
        hi: usize,
        capacity: usize,
        start: Instant,
        deadline: Instant,
    ) -> Result<ShmLink> {
        let total = total_size(capacity).unwrap_or(usize::MAX);
        let (name, segment) = loop {
            let name = segment_name(lo, hi);
            match Segment::create(&name, total) {
                Ok(segment) => break (name, segment),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    let what = format!("creating shared-memory segment {name} of {total} bytes for ranks {lo} and {hi}");
                    return Err(Error::io(what, e));
                }
            }
        };
        let result = (|| {
            header_of(&segment).init(capacity, std::process::id());
            segment
                .lock_byte(0)
                .map_err(|e| Error::io(format!("locking shared-memory segment {name}"), e))?;
            store.set(key, name.as_bytes())?;
            let attached = &header_of(&segment).sides[1].0.attached;
            let mut backoff = Backoff::new();
            while attached.load(Ordering::Acquire) == 0 {
                let now = Instant::now();
                if now >= deadline {
                    return Err(Error::PeerTimeout {
                        peer: hi,
                        during: format!("waiting for rank {hi} to map shared-memory segment {name} (published under {key:?})"),
                        timeout: now - start,
                    });
                }
                crate::cpu::setup_watch::check(|| {
                    format!("rank {hi} to map shared-memory segment {name}")
                })?;
                backoff.snooze();
            }
            // The higher rank has unlinked the name already; the key would
            // only mislead a later connect with the same prefix.
            store.delete_key(key)?;
            Ok(())
        })();
        // Whatever happened, the name must not outlive this call.
        let unlinked = segment::unlink(&name);
        result?;
        unlinked.map_err(|e| Error::io(format!("unlinking shared-memory segment {name}"), e))?;
        Ok(Self::from_segment(segment, 0, lo, hi, capacity))
    }

    fn open_side(
        store: &dyn Store,
        key: &str,
        lo: usize,
        hi: usize,
        capacity: usize,
        start: Instant,
        deadline: Instant,
    ) -> Result<ShmLink> {
        let (name, segment) = loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let raw = store.get_timeout(key, remaining)?;
            let name = String::from_utf8(raw).map_err(|e| Error::BadValue {
                name: key.to_string(),
                expected: "a shared-memory segment name".to_string(),
                found: String::from_utf8_lossy(e.as_bytes()).into_owned(),
            })?;
            match Segment::open(&name) {
                Ok(segment) => break (name, segment),
                // A name left by an earlier connect with the same prefix:
                // wait for rank `lo` to publish a fresh one.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if Instant::now() >= deadline {
                        return Err(Error::PeerTimeout {
                            peer: lo,
                            during: format!("opening shared-memory segment {name} published by rank {lo} under {key:?}, which no longer exists"),
                            timeout: start.elapsed(),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => {
                    return Err(Error::io(
                        format!("opening shared-memory segment {name}"),
                        e,
                    ));
                }
            }
        };
        if segment.len() < HEADER_SIZE {
            return Err(Error::ShmBadHeader {
                segment: name,
                field: "segment size".to_string(),
                expected: format!("at least {HEADER_SIZE} bytes"),
                found: format!("{} bytes", segment.len()),
            });
        }
        let header = header_of(&segment);
        header.validate(&name, capacity, segment.len() as u64)?;
        segment
            .lock_byte(1)
            .map_err(|e| Error::io(format!("locking shared-memory segment {name}"), e))?;
        segment::unlink(&name)
            .map_err(|e| Error::io(format!("unlinking shared-memory segment {name}"), e))?;
        let me = &header.sides[1].0;
        me.pid.store(std::process::id(), Ordering::Relaxed);
        if me
            .attached
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(Error::InvalidArgument(format!(
                "shared-memory segment {name} under {key:?} already has its rank {hi}; was the key prefix used twice?"
            )));
        }
        Ok(Self::from_segment(segment, 1, hi, lo, capacity))
    }

    /// Wraps a segment of `total_size(capacity)` bytes or more whose header
    /// has been initialised (creator) or validated (opener).
    fn from_segment(
        segment: Segment,
        side: usize,
        my_rank: usize,
        peer_rank: usize,
        capacity: usize,
    ) -> ShmLink {
        debug_assert!(segment.len() >= total_size(capacity).unwrap_or(usize::MAX));
        let header = header_of(&segment);
        let peer_pid = header.sides[1 - side].0.pid.load(Ordering::Relaxed);
        let ring = |index: usize| {
            let ctl = NonNull::from(&header.rings[index]);
            // SAFETY: the segment holds the header plus two data areas of
            // `capacity` bytes (checked by the caller), so this offset is
            // inside the mapping.
            let data = unsafe { segment.base().add(data_offset(index, capacity)) };
            // SAFETY: control block and data area stay mapped until the
            // ShmLink (which owns the segment, dropped after the rings)
            // goes. Side s only writes ring s and only reads ring 1 - s,
            // each through a Mutex, so each ring has one producer and one
            // consumer across both processes.
            Mutex::new(unsafe { Ring::new(ctl, data, capacity) })
        };
        let (tx, rx) = (ring(side), ring(1 - side));
        tracing::debug!(my_rank, peer_rank, peer_pid, capacity, "shm link connected");
        ShmLink {
            side,
            my_rank,
            peer_rank,
            peer_pid,
            capacity,
            chunk: (capacity / 4).max(64 << 10).min(capacity),
            tx,
            rx,
            wait: ShmWait::Auto.resolve(2, crate::cpu::host_cpus_online()),
            #[cfg(test)]
            test_sleep: None,
            epoch: Instant::now(),
            next_probe_ns: AtomicU64::new(0),
            segment,
        }
    }

    fn header(&self) -> &Header {
        header_of(&self.segment)
    }

    fn lock(ring: &Mutex<Ring>) -> MutexGuard<'_, Ring> {
        // A panic cannot leave a Ring half-updated: its counters move only
        // after a copy completes. So a poisoned lock is taken over.
        ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// True at most once per PROBE_EVERY, across all calls on this link.
    fn probe_due(&self) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        let next = self.next_probe_ns.load(Ordering::Relaxed);
        now >= next
            && self
                .next_probe_ns
                .compare_exchange(
                    next,
                    now + PROBE_EVERY.as_nanos() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Why the peer is gone, if it is: its closed flag (always checked) or,
    /// when `probe`, the kernel's word that its process no longer holds
    /// its lock on the segment.
    fn peer_gone(&self, probe: bool) -> Option<String> {
        if self.header().sides[self.side]
            .0
            .closed
            .load(Ordering::Relaxed)
            != 0
        {
            return Some(format!(
                "rank {} closed its own end of the link (aborted)",
                self.my_rank
            ));
        }
        let peer = &self.header().sides[1 - self.side].0;
        if peer.closed.load(Ordering::Acquire) != 0 {
            return Some(format!(
                "it closed its shared-memory link (pid {})",
                self.peer_pid
            ));
        }
        // An error from the kernel proves nothing either way: count it alive.
        if probe
            && !self
                .segment
                .byte_locked_elsewhere(1 - self.side)
                .unwrap_or(true)
        {
            return Some(format!("its process (pid {}) exited", self.peer_pid));
        }
        None
    }

    /// One round of waiting in a blocked call: fails if the peer is gone or
    /// the deadline passed, otherwise snoozes.
    ///
    /// Past the first milliseconds it sleeps through `sleep` (on the ring's
    /// signal: the peer's next move wakes it).
    fn wait_blocked(
        &self,
        backoff: &mut Backoff,
        (started, deadline): (Instant, Instant),
        during: &dyn Fn() -> String,
        sleep: impl FnOnce(std::time::Duration),
    ) -> Result<()> {
        let now = Instant::now();
        if let Some(reason) = self.peer_gone(self.probe_due()) {
            return Err(self.died(during(), reason));
        }
        if now >= deadline {
            return Err(Error::PeerTimeout {
                peer: self.peer_rank,
                during: during(),
                timeout: now - started,
            });
        }
        backoff.snooze_on(|d| {
            #[cfg(test)]
            let d = self.test_sleep.unwrap_or(d);
            sleep(d)
        });
        Ok(())
    }

    /// The waiting state of a new blocked call (tests may make it sleep
    /// at once: `test_sleep`).
    fn backoff(&self) -> Backoff {
        let backoff = Backoff::with(self.wait);
        #[cfg(test)]
        let backoff = match self.test_sleep {
            Some(_) => backoff.without_yield(),
            None => backoff,
        };
        backoff
    }

    /// Whether either side has closed the link (a sleeper then wakes).
    fn closed_either(&self) -> bool {
        let sides = &self.header().sides;
        sides
            .iter()
            .any(|s| s.0.closed.load(Ordering::Acquire) != 0)
    }

    fn died(&self, during: String, reason: String) -> Error {
        Error::PeerClosed {
            peer: self.peer_rank,
            during,
            reason,
        }
    }

    /// Sends all of `data`, blocking until the last byte is in the ring
    /// (the peer may still be reading it). Data larger than the ring
    /// streams through it as the peer reads.
    ///
    /// Fails with [`Error::PeerClosed`] if the peer has closed its link or
    /// goes away while this call waits for space, and with
    /// [`Error::PeerTimeout`] if `deadline` passes first.
    pub fn send(&self, data: &[u8], deadline: Instant) -> Result<()> {
        let started = Instant::now();
        let mut tx = Self::lock(&self.tx);
        let mut sent = 0;
        let during = || {
            format!(
                "rank {} was sending {} bytes to it ({sent} sent)",
                self.my_rank,
                data.len()
            )
        };
        if let Some(reason) = self.peer_gone(false) {
            return Err(self.died(during(), reason));
        }
        let mut backoff = self.backoff();
        while sent < data.len() {
            let end = (sent + self.chunk).min(data.len());
            let n = tx.write(&data[sent..end]);
            if n > 0 {
                sent += n;
                backoff.reset();
                continue;
            }
            let during = || {
                format!(
                    "rank {} was sending {} bytes to it ({sent} sent)",
                    self.my_rank,
                    data.len()
                )
            };
            let sleep = |d| tx.sleep_for_space(|| self.closed_either(), d);
            self.wait_blocked(&mut backoff, (started, deadline), &during, sleep)?;
        }
        Ok(())
    }

    /// Fills all of `buf`, blocking until the last byte has arrived.
    ///
    /// Bytes the peer sent before it went away are still delivered; the
    /// call fails with [`Error::PeerClosed`] only when it needs more than
    /// that, and with [`Error::PeerTimeout`] if `deadline` passes.
    pub fn recv(&self, buf: &mut [u8], deadline: Instant) -> Result<()> {
        let started = Instant::now();
        let mut rx = Self::lock(&self.rx);
        let len = buf.len();
        let mut got = 0;
        let mut backoff = self.backoff();
        while got < len {
            let end = (got + self.chunk).min(len);
            let n = rx.read(&mut buf[got..end]);
            if n > 0 {
                got += n;
                backoff.reset();
                continue;
            }
            let during = || {
                format!(
                    "rank {} was receiving {len} bytes from it ({got} received)",
                    self.my_rank
                )
            };
            let sleep = |d| rx.sleep_for_data(|| self.closed_either(), d);
            if let Err(e) = self.wait_blocked(&mut backoff, (started, deadline), &during, sleep) {
                // The peer may have written its last bytes just before it
                // went away (or just before the deadline): take them first.
                match rx.read(&mut buf[got..end]) {
                    0 => return Err(e),
                    n => got += n,
                }
            }
        }
        Ok(())
    }

    /// Writes as much of `data` as fits in the ring now and returns how
    /// many bytes that was (0 when the ring is full). Never blocks.
    ///
    /// Fails with [`Error::PeerClosed`] if the peer has closed its link, or
    /// (checked at most every few milliseconds when nothing fits) if its
    /// process has exited.
    ///
    /// ```
    /// use std::{sync::Arc, thread, time::Duration};
    /// use tensorcomm::cpu::transport::shm::ShmLink;
    /// use tensorcomm::store::HashStore;
    ///
    /// let store = Arc::new(HashStore::new());
    /// let s = store.clone();
    /// let peer = thread::spawn(move || {
    ///     ShmLink::connect(&*s, "try", 1, 0, 4096, Duration::from_secs(10))
    /// });
    /// let link = ShmLink::connect(&*store, "try", 0, 1, 4096, Duration::from_secs(10))?;
    /// let peer = peer.join().unwrap()?;
    ///
    /// let mut buf = [0u8; 8];
    /// assert_eq!(peer.try_recv_some(&mut buf)?, 0); // nothing sent yet
    /// assert_eq!(link.try_send_some(&[7u8; 5000])?, 4096); // the ring is full
    /// assert_eq!(link.try_send_some(&[7u8; 10])?, 0);
    /// assert_eq!(peer.try_recv_some(&mut buf)?, 8);
    /// assert_eq!(buf, [7u8; 8]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn try_send_some(&self, data: &[u8]) -> Result<usize> {
        let mut tx = Self::lock(&self.tx);
        let during = || {
            format!(
                "rank {} was trying to send {} bytes to it",
                self.my_rank,
                data.len()
            )
        };
        if let Some(reason) = self.peer_gone(false) {
            return Err(self.died(during(), reason));
        }
        let n = tx.write(data);
        if n == 0 && !data.is_empty() && self.probe_due() {
            if let Some(reason) = self.peer_gone(true) {
                return Err(self.died(during(), reason));
            }
        }
        Ok(n)
    }

    /// Reads as many bytes as have arrived, up to `buf.len()`, and returns
    /// how many (0 when nothing is there). Never blocks.
    ///
    /// Fails with [`Error::PeerClosed`] when nothing is there and the peer
    /// has closed its link or its process has exited.
    pub fn try_recv_some(&self, buf: &mut [u8]) -> Result<usize> {
        let mut rx = Self::lock(&self.rx);
        let n = rx.read(buf);
        if n > 0 || buf.is_empty() {
            return Ok(n);
        }
        if let Some(reason) = self.peer_gone(self.probe_due()) {
            // Bytes written just before it went away still count.
            return match rx.read(buf) {
                0 => Err(self.died(
                    format!(
                        "rank {} was trying to receive up to {} bytes from it",
                        self.my_rank,
                        buf.len()
                    ),
                    reason,
                )),
                n => Ok(n),
            };
        }
        Ok(0)
    }

    /// Whether bytes from the peer wait in this side's ring, without
    /// blocking: a `recv` would get its first byte at once. Fails with
    /// [`Error::PeerClosed`] when nothing waits and the peer is gone (its
    /// closed flag at once, its process lock every few milliseconds).
    pub fn has_data(&self, during: &str) -> Result<bool> {
        if Self::lock(&self.rx).readable() > 0 {
            return Ok(true);
        }
        match self.peer_gone(self.probe_due()) {
            // Bytes written just before it went away still count.
            Some(reason) if Self::lock(&self.rx).readable() == 0 => {
                Err(self.died(during.to_string(), reason))
            }
            Some(_) => Ok(true),
            None => Ok(false),
        }
    }

    /// Whether the peer still has its link open and its process running
    /// (asks the kernel, so costs a system call).
    pub fn peer_alive(&self) -> bool {
        self.peer_gone(true).is_none()
    }

    /// [`peer_alive`](Self::peer_alive) as an error naming the peer and why
    /// it is gone, for a caller that was `during` something.
    pub fn check_alive(&self, during: &str) -> Result<()> {
        match self.peer_gone(true) {
            None => Ok(()),
            Some(reason) => Err(self.died(during.to_string(), reason)),
        }
    }

    /// Closes this end as dropping the link does, but through a shared
    /// reference: the peer's blocked and later calls fail at once with
    /// [`Error::PeerClosed`], and so do this side's later calls. Bytes
    /// already in the peer's ring can still be read by it.
    ///
    /// ```
    /// use std::{sync::Arc, thread, time::{Duration, Instant}};
    /// use tensorcomm::cpu::transport::shm::ShmLink;
    /// use tensorcomm::store::HashStore;
    /// use tensorcomm::Error;
    ///
    /// let store = Arc::new(HashStore::new());
    /// let s = store.clone();
    /// let peer = thread::spawn(move || ShmLink::connect(&*s, "close", 1, 0, 4096, Duration::from_secs(10)));
    /// let link = ShmLink::connect(&*store, "close", 0, 1, 4096, Duration::from_secs(10))?;
    /// let peer = peer.join().unwrap()?;
    /// link.close();
    /// let mut buf = [0u8; 4];
    /// let err = peer.recv(&mut buf, Instant::now() + Duration::from_secs(10)).unwrap_err();
    /// assert!(matches!(err, Error::PeerClosed { peer: 0, .. }));
    /// assert!(link.try_send_some(b"x").is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn close(&self) {
        self.header().sides[self.side]
            .0
            .closed
            .store(1, Ordering::Release);
        // Sleepers on either side look again, and find the flag.
        for ring in &self.header().rings {
            wake_all(ring);
        }
    }

    /// The rank at the other end.
    pub fn peer_rank(&self) -> usize {
        self.peer_rank
    }

    /// Sets how blocked calls wait for the peer ([`ShmWait`]); `Auto`
    /// counts the two ranks of this link against the host's cores, which
    /// is also how a new link waits. A group's transport sets every link
    /// from the group's count of ranks on this host.
    pub fn set_wait(&mut self, wait: ShmWait) {
        self.wait = wait.resolve(2, crate::cpu::host_cpus_online());
    }

    /// How blocked calls wait: [`ShmWait::Spin`] or [`ShmWait::Sleep`].
    pub fn wait(&self) -> ShmWait {
        self.wait
    }

    /// Sleeps up to `timeout` unless bytes from the peer are there or
    /// either side has closed the link; returns early when the peer
    /// writes (or closes). For a caller that waits with its own
    /// [`Backoff`] on non-blocking calls.
    pub(super) fn sleep_for_data(&self, timeout: Duration) {
        Self::lock(&self.rx).sleep_for_data(|| self.closed_either(), timeout);
    }

    /// Sleeps up to `timeout` unless the ring to the peer has space or
    /// either side has closed the link; returns early when the peer reads
    /// (or closes).
    pub(super) fn sleep_for_space(&self, timeout: Duration) {
        Self::lock(&self.tx).sleep_for_space(|| self.closed_either(), timeout);
    }
}

impl fmt::Debug for ShmLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShmLink")
            .field("my_rank", &self.my_rank)
            .field("peer_rank", &self.peer_rank)
            .field("peer_pid", &self.peer_pid)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl Drop for ShmLink {
    /// Marks this side closed, so the peer's blocked calls fail at once;
    /// unmapping the segment (and so releasing the lock) follows.
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod wait_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HashStore;

    #[test]
    fn a_foreign_segment_is_refused_with_expected_and_found() {
        let store = HashStore::new();
        let name = format!("/tcshm-test.{}.foreign", std::process::id());
        let total = total_size(4096).unwrap();
        let segment = Segment::create(&name, total).unwrap();
        header_of(&segment).init(4096, 1);
        header_of(&segment)
            .ident
            .0
            .magic
            .store(0x1234, Ordering::Release);
        store.set("foreign/shm/0-1", name.as_bytes()).unwrap();
        let err = ShmLink::connect(&store, "foreign", 1, 0, 4096, Duration::from_secs(5));
        segment::unlink(&name).unwrap();
        match err {
            Err(Error::ShmBadHeader {
                segment,
                field,
                expected,
                found,
            }) => {
                assert_eq!(segment, name);
                assert_eq!(field, "magic");
                assert_eq!(expected, format!("{:#018x}", super::super::layout::MAGIC));
                assert_eq!(found, "0x0000000000001234");
            }
            other => panic!("expected a bad header error, found {other:?}"),
        }
    }

    #[test]
    fn a_capacity_mismatch_is_refused() {
        let store = HashStore::new();
        let name = format!("/tcshm-test.{}.capacity", std::process::id());
        let segment = Segment::create(&name, total_size(4096).unwrap()).unwrap();
        header_of(&segment).init(4096, 1);
        store.set("cap/shm/0-1", name.as_bytes()).unwrap();
        let err = ShmLink::connect(&store, "cap", 1, 0, 8192, Duration::from_secs(5))
            .unwrap_err()
            .to_string();
        segment::unlink(&name).unwrap();
        assert!(err.contains("expected ring capacity"), "{err}");
        assert!(err.contains("8192, found 4096"), "{err}");
    }

    #[test]
    fn links_can_be_shared_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ShmLink>();
    }

    #[test]
    fn bad_arguments_are_refused_before_touching_the_store() {
        let store = HashStore::new();
        let same = ShmLink::connect(&store, "x", 3, 3, 4096, Duration::from_secs(1));
        assert!(matches!(same, Err(Error::InvalidArgument(m)) if m.contains("found 3 for both")));
        let zero = ShmLink::connect(&store, "x", 0, 1, 0, Duration::from_secs(1));
        assert!(matches!(zero, Err(Error::InvalidArgument(m)) if m.contains("found 0")));
        assert_eq!(store.num_keys().unwrap(), 0);
    }
}
