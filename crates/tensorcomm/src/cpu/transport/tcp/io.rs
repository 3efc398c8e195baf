//! Blocking reads and writes of exact lengths on one TCP stream, bounded by
//! a deadline, with errors that name the peer.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// One direction of a connection: the stream handle used for it and the
/// socket timeout last set on it (to avoid a system call per transfer).
pub(super) struct Half {
    pub(super) stream: TcpStream,
    timeout: Option<Duration>,
}

/// Which way a [`Half`] moves bytes.
#[derive(Clone, Copy)]
pub(super) enum Direction {
    Read,
    Write,
}

impl Half {
    pub(super) fn new(stream: TcpStream) -> Self {
        Half {
            stream,
            timeout: None,
        }
    }

    /// Makes the socket timeout at most `remaining` (plus a little slack, so
    /// that back-to-back calls with similar deadlines do not each pay a
    /// system call) and not much shorter than it.
    fn arm(&mut self, direction: Direction, remaining: Duration) -> std::io::Result<()> {
        let slack = Duration::from_millis(5) + remaining / 100;
        let fits = self
            .timeout
            .is_some_and(|t| t <= remaining + slack && t >= remaining / 2);
        if !fits {
            match direction {
                Direction::Read => self.stream.set_read_timeout(Some(remaining))?,
                Direction::Write => self.stream.set_write_timeout(Some(remaining))?,
            }
            self.timeout = Some(remaining);
        }
        Ok(())
    }
}

/// What a transfer was doing, for error messages.
pub(super) struct Context<'a> {
    pub(super) peer: usize,
    pub(super) what: &'a str,
    pub(super) len: usize,
    pub(super) started: Instant,
    pub(super) deadline: Instant,
}

impl Context<'_> {
    /// The same transfer's context for a part of it: `len` bytes, `what`.
    pub(super) fn part<'b>(&self, what: &'b str, len: usize) -> Context<'b> {
        Context {
            peer: self.peer,
            what,
            len,
            started: self.started,
            deadline: self.deadline,
        }
    }

    fn during(&self, done: usize) -> String {
        format!("{} ({done} of {} bytes transferred)", self.what, self.len)
    }

    fn timeout(&self, done: usize) -> Error {
        Error::PeerTimeout {
            peer: self.peer,
            during: self.during(done),
            timeout: self.deadline.saturating_duration_since(self.started),
        }
    }

    fn closed(&self, done: usize, kind: ErrorKind) -> Error {
        let reason = match kind {
            ErrorKind::UnexpectedEof => "it closed its TCP connection".to_string(),
            kind => format!("its TCP connection broke ({kind})"),
        };
        Error::PeerClosed {
            peer: self.peer,
            during: self.during(done),
            reason,
        }
    }

    /// Maps an I/O error to a typed error; `None` means "retry".
    fn classify(&self, err: std::io::Error, done: usize) -> Option<Error> {
        match err.kind() {
            ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut => None,
            ErrorKind::BrokenPipe
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::UnexpectedEof => Some(self.closed(done, err.kind())),
            _ => Some(Error::PeerIo {
                peer: self.peer,
                during: self.during(done),
                source: err,
            }),
        }
    }
}

/// True when this end of `stream` sent its FIN and the peer has not closed
/// or reset the connection since: its TCP state is FIN-WAIT-1 or -2 or
/// CLOSING. Then this process shut the socket down (a write after that
/// fails with a broken pipe, a read returns end of stream, just as when the
/// peer left). A peer that closed first leaves CLOSE-WAIT or LAST-ACK; a
/// reset, and a FIN from the peer after this side's (TIME-WAIT moves to a
/// separate entry), leave CLOSED, which says nothing: a reset also follows
/// data a peer sends after this side shut down reading.
pub(super) fn shut_down_here(stream: &TcpStream) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // Linux's TCP states (include/net/tcp_states.h).
        const FIN_WAIT1: u8 = 4;
        const FIN_WAIT2: u8 = 5;
        const CLOSING: u8 = 11;
        // SAFETY: an all-zero tcp_info is a valid value of the plain C
        // struct, which getsockopt fills up to `len` bytes.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: `info` and `len` are live locals of the sizes passed.
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        rc == 0 && len >= 1 && matches!(info.tcpi_state, FIN_WAIT1 | FIN_WAIT2 | CLOSING)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = stream;
        false
    }
}

/// Writes all of `data`, waiting at most until the context's deadline.
pub(super) fn write_all(half: &mut Half, data: &[u8], cx: &Context<'_>) -> Result<()> {
    let mut done = 0;
    while done < data.len() {
        let remaining = cx.deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(cx.timeout(done));
        }
        if let Err(e) = half.arm(Direction::Write, remaining) {
            return Err(cx.classify(e, done).unwrap_or_else(|| cx.timeout(done)));
        }
        match half.stream.write(&data[done..]) {
            Ok(0) => return Err(cx.closed(done, ErrorKind::UnexpectedEof)),
            Ok(n) => done += n,
            Err(e) => {
                if let Some(err) = cx.classify(e, done) {
                    return Err(err);
                }
            }
        }
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes, waiting at most until the deadline.
pub(super) fn read_exact(half: &mut Half, buf: &mut [u8], cx: &Context<'_>) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let remaining = cx.deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(cx.timeout(done));
        }
        if let Err(e) = half.arm(Direction::Read, remaining) {
            return Err(cx.classify(e, done).unwrap_or_else(|| cx.timeout(done)));
        }
        match half.stream.read(&mut buf[done..]) {
            Ok(0) => return Err(cx.closed(done, ErrorKind::UnexpectedEof)),
            Ok(n) => done += n,
            Err(e) => {
                if let Some(err) = cx.classify(e, done) {
                    return Err(err);
                }
            }
        }
    }
    Ok(())
}

/// Moves `data` out through `writer` and `buf.len()` bytes in through
/// `reader` at the same time without blocking, busy-polling both sockets,
/// until both are done or neither has moved for `patience` (or the
/// deadline passed). Returns how many bytes went each way; the streams are
/// blocking again afterwards. Saves the helper thread a blocking exchange
/// needs while both peers are there and the data flows.
pub(super) fn exchange_without_blocking(
    writer: &mut Half,
    data: &[u8],
    send_cx: &Context<'_>,
    reader: &mut Half,
    buf: &mut [u8],
    recv_cx: &Context<'_>,
    patience: Duration,
) -> Result<(usize, usize)> {
    let io_err = |cx: &Context<'_>, e: std::io::Error| Error::PeerIo {
        peer: cx.peer,
        during: cx.during(0),
        source: e,
    };
    writer
        .stream
        .set_nonblocking(true)
        .map_err(|e| io_err(send_cx, e))?;
    if let Err(e) = reader.stream.set_nonblocking(true) {
        let _ = writer.stream.set_nonblocking(false);
        return Err(io_err(recv_cx, e));
    }
    let (mut sent, mut received) = (0, 0);
    let mut last_progress = Instant::now();
    let mut idle_rounds = 0u32;
    let failure = loop {
        let mut progress = false;
        if sent < data.len() {
            match writer.stream.write(&data[sent..]) {
                Ok(0) => break Some(send_cx.closed(sent, ErrorKind::UnexpectedEof)),
                Ok(n) => {
                    sent += n;
                    progress = true;
                }
                Err(e) => {
                    if let Some(err) = send_cx.classify(e, sent) {
                        break Some(err);
                    }
                }
            }
        }
        if received < buf.len() {
            match reader.stream.read(&mut buf[received..]) {
                Ok(0) => break Some(recv_cx.closed(received, ErrorKind::UnexpectedEof)),
                Ok(n) => {
                    received += n;
                    progress = true;
                }
                Err(e) => {
                    if let Some(err) = recv_cx.classify(e, received) {
                        break Some(err);
                    }
                }
            }
        }
        if sent == data.len() && received == buf.len() {
            break None;
        }
        if progress {
            last_progress = Instant::now();
            idle_rounds = 0;
        } else {
            let now = Instant::now();
            if now - last_progress >= patience || now >= send_cx.deadline {
                break None;
            }
            idle_rounds += 1;
            if idle_rounds < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    };
    let restored = writer
        .stream
        .set_nonblocking(false)
        .and_then(|()| reader.stream.set_nonblocking(false));
    if let Some(err) = failure {
        return Err(err);
    }
    restored.map_err(|e| io_err(send_cx, e))?;
    Ok((sent, received))
}
