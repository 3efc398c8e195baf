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

/// Writes as much of `data` as the socket takes without blocking and
/// returns how much that was. The stream is blocking again afterwards.
pub(super) fn write_without_blocking(
    half: &mut Half,
    data: &[u8],
    cx: &Context<'_>,
) -> Result<usize> {
    let io_err = |e: std::io::Error| Error::PeerIo {
        peer: cx.peer,
        during: cx.during(0),
        source: e,
    };
    half.stream.set_nonblocking(true).map_err(io_err)?;
    let mut done = 0;
    let mut failure = None;
    while done < data.len() {
        match half.stream.write(&data[done..]) {
            Ok(0) => {
                failure = Some(cx.closed(done, ErrorKind::UnexpectedEof));
                break;
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => {
                let kind = e.kind();
                failure = Some(
                    cx.classify(e, done)
                        .unwrap_or_else(|| cx.closed(done, kind)),
                );
                break;
            }
        }
    }
    half.stream.set_nonblocking(false).map_err(io_err)?;
    match failure {
        Some(err) => Err(err),
        None => Ok(done),
    }
}
