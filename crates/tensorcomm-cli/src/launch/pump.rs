//! One thread that copies every rank's output pipes to our stdout and
//! stderr, whole prefixed lines at a time.
//!
//! One thread for all pipes, waiting in `epoll`, rather than a thread per
//! pipe: each thread's stack is a mapping that every later `fork` of a rank
//! copies, so threads per rank made starting N ranks cost O(N²) (2000 ranks
//! took 42 s on 2 cores, 35 s of it in the kernel). One writer also means
//! lines of different ranks cannot interleave.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::output::{self, LineSplitter, Stream};

/// How long one wait for output lasts before the thread looks whether it
/// should end.
const WAKE_MS: libc::c_int = 50;
/// How often [`OutputPump::drain`] looks at the thread.
const DRAIN_POLL: Duration = Duration::from_millis(20);
/// The most bytes one read takes from one pipe.
const READ_BYTES: usize = 64 * 1024;

/// A rank's pipe that is still open, as `(rank, stream)`.
type OpenPipes = Arc<Mutex<BTreeSet<(usize, Stream)>>>;

/// One pipe being copied.
struct Source {
    token: u64,
    rank: usize,
    stream: Stream,
    pipe: File,
    lines: LineSplitter,
}

/// The copying thread and the way to hand it pipes.
pub struct OutputPump {
    epoll: Arc<OwnedFd>,
    sources: Sender<Source>,
    next_token: u64,
    open: OpenPipes,
    /// Bytes written so far: tells a pipe still draining from one held
    /// open by a process the rank left behind.
    progress: Arc<AtomicU64>,
    /// No more pipes will come; end once the open ones are done.
    closing: Arc<AtomicBool>,
    /// End now, whatever is still open.
    quit: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl OutputPump {
    /// Start the thread.
    pub fn start() -> io::Result<Self> {
        // SAFETY: epoll_create1 takes a flag and returns a new descriptor or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let epoll = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let (sources, incoming) = mpsc::channel();
        let open = OpenPipes::default();
        let progress = Arc::new(AtomicU64::new(0));
        let closing = Arc::new(AtomicBool::new(false));
        let quit = Arc::new(AtomicBool::new(false));
        let copier = Copier {
            epoll: epoll.clone(),
            incoming,
            sources: HashMap::new(),
            open: open.clone(),
            progress: progress.clone(),
            closing: closing.clone(),
            quit: quit.clone(),
        };
        let thread = thread::Builder::new()
            .name("rank-output".into())
            .spawn(move || copier.run())?;
        Ok(OutputPump {
            epoll,
            sources,
            next_token: 0,
            open,
            progress,
            closing,
            quit,
            thread,
        })
    }

    /// Copy `pipe`, the `stream` of `rank`, with the rank's prefix.
    pub fn add(&mut self, rank: usize, stream: Stream, pipe: impl Into<OwnedFd>) -> io::Result<()> {
        let pipe = File::from(pipe.into());
        let fd = pipe.as_raw_fd();
        let token = self.next_token;
        self.next_token += 1;
        let source = Source {
            token,
            rank,
            stream,
            pipe,
            lines: LineSplitter::new(format!("[rank{rank}]: ")),
        };
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((rank, stream));
        // Sent before the pipe is watched, so the thread knows it by its
        // first event.
        if self.sources.send(source).is_err() {
            return Err(io::Error::other("the output thread has ended"));
        }
        let mut event = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLHUP | libc::EPOLLERR) as u32,
            u64: token,
        };
        // SAFETY: both descriptors are open (the pipe is owned by the Source
        // in the channel, which the thread closes only after an event for
        // it, i.e. after this call); `event` is a valid epoll_event.
        let rc =
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// No more pipes come: wait for the open ones to reach end of file. A
    /// pipe that stays open with no output for `stall` is held by a process
    /// the rank left behind; say so and stop waiting for it rather than hang.
    pub fn drain(self, stall: Duration) {
        self.closing.store(true, Ordering::SeqCst);
        let mut last = self.progress.load(Ordering::Relaxed);
        let mut last_change = Instant::now();
        while !self.thread.is_finished() {
            if last_change.elapsed() >= stall {
                self.quit.store(true, Ordering::SeqCst);
                let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
                for (rank, stream) in open.iter() {
                    output::launcher_line(&format!(
                        "rank {rank}'s {} is still open {stall:?} after it exited (a process it started holds it); not waiting for it",
                        stream.name()
                    ));
                }
                return;
            }
            thread::sleep(DRAIN_POLL);
            let now = self.progress.load(Ordering::Relaxed);
            if now != last {
                last = now;
                last_change = Instant::now();
            }
        }
        if self.thread.join().is_err() {
            tracing::warn!("the output thread panicked");
        }
    }
}

/// The thread's side.
struct Copier {
    epoll: Arc<OwnedFd>,
    incoming: Receiver<Source>,
    sources: HashMap<u64, Source>,
    open: OpenPipes,
    progress: Arc<AtomicU64>,
    closing: Arc<AtomicBool>,
    quit: Arc<AtomicBool>,
}

impl Copier {
    fn run(mut self) {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let mut buffer = vec![0u8; READ_BYTES];
        while !self.quit.load(Ordering::SeqCst) {
            // Read before taking the new sources: a source sent after this
            // load is seen on a later turn.
            let closing = self.closing.load(Ordering::SeqCst);
            self.sources
                .extend(self.incoming.try_iter().map(|s| (s.token, s)));
            if closing && self.sources.is_empty() {
                return;
            }
            // SAFETY: `events` has room for `len` entries; the descriptor is open.
            let n = unsafe {
                libc::epoll_wait(
                    self.epoll.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as libc::c_int,
                    WAKE_MS,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::warn!("cannot wait for rank output, no more is copied: {e}");
                return;
            }
            for event in &events[..n as usize] {
                let token = event.u64;
                if !self.sources.contains_key(&token) {
                    self.sources
                        .extend(self.incoming.try_iter().map(|s| (s.token, s)));
                }
                if let Some(source) = self.sources.get_mut(&token) {
                    if !copy_once(source, &mut buffer, &self.progress) {
                        self.close(token);
                    }
                }
            }
        }
    }

    /// Stop copying the source `token`: take it out of epoll and close it.
    /// Closing the pipe means a rank still writing gets EPIPE/SIGPIPE, as it
    /// would writing to our closed stream itself (`tensorcomm run ... | head`).
    fn close(&mut self, token: u64) {
        if let Some(source) = self.sources.remove(&token) {
            // SAFETY: both descriptors are open; a null event is allowed for DEL.
            unsafe {
                libc::epoll_ctl(
                    self.epoll.as_raw_fd(),
                    libc::EPOLL_CTL_DEL,
                    source.pipe.as_raw_fd(),
                    std::ptr::null_mut(),
                );
            }
            self.open
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&(source.rank, source.stream));
        }
    }
}

/// One read from a readable pipe, its whole lines written out. Returns
/// whether to go on copying it (false at end of file or when our own stream
/// cannot be written any more).
fn copy_once(source: &mut Source, buffer: &mut [u8], progress: &AtomicU64) -> bool {
    let stream = source.stream;
    let mut emit = |line: &[u8]| {
        stream.write_line(line)?;
        progress.fetch_add(line.len() as u64, Ordering::Relaxed);
        Ok(())
    };
    let result = match source.pipe.read(buffer) {
        Ok(0) => source.lines.finish(&mut emit).and(Ok(false)),
        Ok(n) => source.lines.feed(&buffer[..n], &mut emit).and(Ok(true)),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(true),
        Err(e) => source.lines.finish(&mut emit).and(Err(e)),
    };
    match result {
        Ok(go_on) => go_on,
        Err(e) => {
            tracing::debug!(
                rank = source.rank,
                stream = stream.name(),
                "stopped copying output: {e}"
            );
            false
        }
    }
}
