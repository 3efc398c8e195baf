//! The accepted connections whose hello is still being read, each on a
//! short-lived thread of its own, so that a connection that sends nothing
//! (or trickles bytes) holds up only itself while fewer than `cap` are
//! pending: a real peer is admitted as soon as its own hello arrives,
//! whatever strays were accepted before it, and each stray is dropped when
//! its own wait runs out.
//!
//! At most `cap` hellos are read at once ([`MAX_PENDING_HELLOS`] in
//! set-up). With that many pending, the accepting rank stops accepting
//! (newcomers wait in the kernel's backlog) and cuts short those pending
//! longer than [`STALE_AFTER`]: a real peer sends its hello as soon as it
//! connects, so those are strays. A flood of silent connections so costs
//! a bounded number of threads and descriptors, but it does delay the
//! real peers: one queued in the backlog behind the flood waits about
//! [`STALE_AFTER`] for every `cap` strays ahead of it (each batch is cut
//! short before the next is accepted), rather than every stray's full
//! wait.
//!
//! Cutting a hello short shuts its socket down, which ends the blocked
//! read at once. A read that ended first is never cut: each hello's state
//! (pending, read, cut) is settled once, by whichever of its reader and
//! [`PendingHellos::cut_stale`] comes first, so a real peer whose hello
//! arrived just before the cut is still admitted. The hellos still
//! pending when set-up ends (dropping the [`PendingHellos`]) are cut short
//! the same way, so no reader outlives set-up by more than a moment; the
//! threads are not joined, so a reader whose socket could not be shut
//! down ends at its own timeout without holding set-up.

use std::collections::VecDeque;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::io::Half;
use crate::{Error, Result};

/// How many hellos an accepting rank reads at once.
pub(super) const MAX_PENDING_HELLOS: usize = 64;
/// The stack of a thread reading a hello: it reads 64 bytes and checks
/// them, and up to [`MAX_PENDING_HELLOS`] run at once.
const READER_STACK: usize = 64 << 10;
/// How long a hello may be pending before it is cut short to make room,
/// once [`MAX_PENDING_HELLOS`] are.
pub(super) const STALE_AFTER: Duration = Duration::from_secs(1);

/// How the read of one hello ended.
pub(super) enum Outcome<T> {
    /// The read finished: the connection and what was read.
    Read(Half, T),
    /// The read failed (the connection closed, sent garbage, or ran out of
    /// time); the connection is closed.
    Failed(Error),
    /// Cut short to make room (see the module docs); the connection is
    /// closed.
    CutShort,
}

/// A hello's state while its reader runs: set once from [`PENDING`] to
/// [`READ`] by the reader when its read ends, or to [`CUT`] by
/// [`PendingHellos::cut_stale`], whichever comes first.
const PENDING: u8 = 0;
/// The reader's read ended (well or not) before any cut: its outcome stands.
const READ: u8 = 1;
/// Cut short before the read ended: the socket was shut down.
const CUT: u8 = 2;

/// One hello read that ended.
pub(super) struct Finished<T> {
    /// The address the connection came from.
    pub(super) from: SocketAddr,
    pub(super) outcome: Outcome<T>,
}

/// A hello being read.
struct Entry {
    id: u64,
    since: Instant,
    /// A second handle on the socket, to shut it down.
    control: TcpStream,
    /// [`PENDING`], [`READ`] or [`CUT`], shared with the reader.
    state: Arc<AtomicU8>,
}

/// What a reading thread sends back.
type Report<T> = (u64, SocketAddr, Half, Result<T>);

/// The hellos being read, oldest first.
pub(super) struct PendingHellos<T> {
    cap: usize,
    entries: VecDeque<Entry>,
    next_id: u64,
    done_tx: Sender<Report<T>>,
    done_rx: Receiver<Report<T>>,
}

impl<T: Send + 'static> PendingHellos<T> {
    /// Reads at most `cap` hellos at once (at least one).
    pub(super) fn new(cap: usize) -> Self {
        let (done_tx, done_rx) = channel();
        PendingHellos {
            cap: cap.max(1),
            entries: VecDeque::new(),
            next_id: 0,
            done_tx,
            done_rx,
        }
    }

    /// How many connections have sent no hello yet: their reads have not
    /// ended (or were cut short and their readers have not reported yet).
    pub(super) fn without_hello(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| e.state.load(Ordering::Acquire) != READ)
            .count()
    }

    /// Whether `cap` hellos are being read (accept no more until one ends).
    pub(super) fn is_full(&self) -> bool {
        self.entries.len() >= self.cap
    }

    /// Reads the hello of `stream` (a blocking socket, from `from`) with
    /// `read` on a thread of its own; [`PendingHellos::next`] gives back
    /// the outcome. Fails only when this process is out of descriptors or
    /// threads; `stream` is then closed.
    pub(super) fn start(
        &mut self,
        stream: TcpStream,
        from: SocketAddr,
        read: impl FnOnce(&mut Half) -> Result<T> + Send + 'static,
    ) -> Result<()> {
        let control = stream
            .try_clone()
            .map_err(|e| Error::io("duplicating an accepted transport connection", e))?;
        let id = self.next_id;
        let done = self.done_tx.clone();
        let state = Arc::new(AtomicU8::new(PENDING));
        let settled = state.clone();
        std::thread::Builder::new()
            .name("tensorcomm-hello".into())
            .stack_size(READER_STACK)
            .spawn(move || {
                let mut half = Half::new(stream);
                let read = read(&mut half);
                // Lost only to a cut: then the outcome is CutShort.
                let _ =
                    settled.compare_exchange(PENDING, READ, Ordering::AcqRel, Ordering::Acquire);
                // Set-up may be over, and nobody is listening: fine.
                let _ = done.send((id, from, half, read));
            })
            .map_err(|e| Error::io("starting a thread to read a transport hello", e))?;
        self.next_id += 1;
        self.entries.push_back(Entry {
            id,
            since: Instant::now(),
            control,
            state,
        });
        Ok(())
    }

    /// Cuts short every hello pending for `older_than` or longer whose
    /// read has not ended yet; returns how many it cut. Each comes back
    /// from [`PendingHellos::next`] as [`Outcome::CutShort`] once its
    /// thread saw the socket shut. One whose read just ended is left be:
    /// its outcome is on its way to [`PendingHellos::next`].
    pub(super) fn cut_stale(&mut self, older_than: Duration) -> usize {
        let now = Instant::now();
        let mut cut = 0;
        for entry in &self.entries {
            if now.saturating_duration_since(entry.since) >= older_than
                && entry
                    .state
                    .compare_exchange(PENDING, CUT, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                // Already closed by the peer is as good as shut.
                let _ = entry.control.shutdown(Shutdown::Both);
                cut += 1;
            }
        }
        cut
    }

    /// The next hello read that ended, waiting up to `wait` for one
    /// (blocked, not spinning); `None` when none ended in that time.
    pub(super) fn next(&mut self, wait: Duration) -> Option<Finished<T>> {
        let (id, from, half, read) = if wait.is_zero() {
            self.done_rx.try_recv().ok()?
        } else {
            match self.done_rx.recv_timeout(wait) {
                Ok(report) => report,
                // This holds a sender: the channel never disconnects.
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        };
        let at = self.entries.iter().position(|e| e.id == id);
        // The reader settled the state before it reported: it is final.
        let cut = at
            .and_then(|at| self.entries.remove(at))
            .is_some_and(|e| e.state.load(Ordering::Acquire) == CUT);
        let outcome = match read {
            _ if cut => Outcome::CutShort,
            Ok(value) => Outcome::Read(half, value),
            Err(e) => Outcome::Failed(e),
        };
        Some(Finished { from, outcome })
    }
}

impl<T> Drop for PendingHellos<T> {
    fn drop(&mut self) {
        for entry in &self.entries {
            let _ = entry.control.shutdown(Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// Reads 4 bytes, waiting up to 10 s.
    fn four_bytes(half: &mut Half) -> Result<[u8; 4]> {
        half.stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| Error::io("arming", e))?;
        let mut buf = [0u8; 4];
        half.stream
            .read_exact(&mut buf)
            .map_err(|e| Error::io("reading", e))?;
        Ok(buf)
    }

    /// A connected pair: (the client's end, the accepted end and its address).
    fn pair(listener: &TcpListener) -> (TcpStream, TcpStream, SocketAddr) {
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, from) = listener.accept().unwrap();
        (client, accepted, from)
    }

    /// Whether the client's end sees its connection closed within 5 s.
    fn closed_soon(client: &mut TcpStream) -> bool {
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut byte = [0u8; 1];
        match client.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
        }
    }

    #[test]
    fn a_quick_hello_ends_before_a_silent_one_accepted_earlier() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut pending = PendingHellos::new(4);
        let (mut silent, accepted, from) = pair(&listener);
        pending.start(accepted, from, four_bytes).unwrap();
        let (mut quick, accepted, from) = pair(&listener);
        pending.start(accepted, from, four_bytes).unwrap();
        let started = Instant::now();
        quick.write_all(b"ping").unwrap();
        let done = pending
            .next(Duration::from_secs(5))
            .expect("the quick hello");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(done.from, from);
        match done.outcome {
            Outcome::Read(mut half, got) => {
                assert_eq!(&got, b"ping");
                // The connection comes back usable.
                half.stream.write_all(b"pong").unwrap();
                let mut back = [0u8; 4];
                quick.read_exact(&mut back).unwrap();
                assert_eq!(&back, b"pong");
            }
            _ => panic!("expected the quick hello to be read"),
        }
        assert!(
            pending.next(Duration::ZERO).is_none(),
            "the silent one is still pending"
        );
        assert_eq!(pending.without_hello(), 1);
        // Set-up over: the silent connection is closed at once, not at its
        // reader's 10 s timeout.
        drop(pending);
        assert!(closed_soon(&mut silent));
        assert!(started.elapsed() < Duration::from_secs(9));
    }

    #[test]
    fn at_the_cap_the_stale_hellos_are_cut_short_and_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut pending = PendingHellos::new(3);
        let mut clients = Vec::new();
        for _ in 0..3 {
            assert!(!pending.is_full());
            let (client, accepted, from) = pair(&listener);
            pending.start(accepted, from, four_bytes).unwrap();
            clients.push(client);
        }
        assert!(pending.is_full());
        // None is a minute old yet.
        assert_eq!(pending.cut_stale(Duration::from_secs(60)), 0);
        assert_eq!(pending.cut_stale(Duration::ZERO), 3);
        assert_eq!(pending.cut_stale(Duration::ZERO), 0, "cut once");
        let started = Instant::now();
        for _ in 0..3 {
            let done = pending.next(Duration::from_secs(5)).expect("a cut hello");
            assert!(matches!(done.outcome, Outcome::CutShort));
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(!pending.is_full());
        for client in &mut clients {
            assert!(closed_soon(client));
        }
    }

    #[test]
    fn a_hello_read_just_before_a_cut_is_not_cut_short() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut pending = PendingHellos::new(1);
        let (mut client, accepted, from) = pair(&listener);
        pending.start(accepted, from, four_bytes).unwrap();
        client.write_all(b"ping").unwrap();
        // The read ended, but set-up has not taken its report yet: the
        // entry is still listed, as when its report lands between the
        // accept loop's look at the finished reads and its cut.
        let state = pending.entries[0].state.clone();
        let started = Instant::now();
        while state.load(Ordering::Acquire) == PENDING {
            assert!(started.elapsed() < Duration::from_secs(5), "never read");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(pending.cut_stale(Duration::ZERO), 0, "a read hello is cut");
        let done = pending.next(Duration::from_secs(5)).expect("the hello");
        match done.outcome {
            Outcome::Read(mut half, got) => {
                assert_eq!(&got, b"ping");
                // Not shut down: the connection is still usable.
                half.stream.write_all(b"pong").unwrap();
                let mut back = [0u8; 4];
                client.read_exact(&mut back).unwrap();
                assert_eq!(&back, b"pong");
            }
            _ => panic!("expected the hello to be read, not cut short"),
        }
    }

    #[test]
    fn a_failed_read_comes_back_as_its_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut pending = PendingHellos::new(1);
        let (client, accepted, from) = pair(&listener);
        pending.start(accepted, from, four_bytes).unwrap();
        drop(client);
        let done = pending
            .next(Duration::from_secs(5))
            .expect("the failed read");
        match done.outcome {
            Outcome::Failed(e) => assert!(e.to_string().contains("reading"), "{e}"),
            _ => panic!("expected the read to fail"),
        }
        assert!(pending.next(Duration::from_millis(10)).is_none());
    }
}
