//! Rank output with a `[rankN]: ` prefix on every line.
//!
//! One thread per rank and stream reads the child's pipe and writes whole
//! lines, prefix included, to our stdout or stderr under its lock, so lines
//! of different ranks never interleave. Bytes are passed through as they are
//! (no UTF-8 decoding). A carriage return also ends a line, so progress bars
//! that redraw with `\r` show up as they are drawn; a `\n` right after it is
//! written without a second prefix. A last line without a newline is written
//! with one added.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

/// Which of our streams a child's pipe is copied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    /// `stdout` or `stderr`.
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    /// Write one whole line under the stream's lock.
    fn write_line(self, line: &[u8]) -> io::Result<()> {
        match self {
            Stream::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(line)?;
                out.flush()
            }
            Stream::Stderr => io::stderr().lock().write_all(line),
        }
    }
}

/// A thread copying one pipe of one rank.
pub struct Forwarder {
    /// The global rank whose output it copies.
    pub rank: usize,
    /// Which stream.
    pub stream: Stream,
    /// The thread; it ends when the pipe reaches end of file or our stream
    /// cannot be written any more.
    pub thread: JoinHandle<()>,
}

/// Start copying `pipe` to `stream` with the prefix of `rank`. `progress`
/// counts the bytes written, so the launcher can tell a pipe that is still
/// draining from one held open by a process the rank left behind.
pub fn spawn_forwarder(
    rank: usize,
    stream: Stream,
    pipe: impl Read + Send + 'static,
    progress: Arc<AtomicU64>,
) -> io::Result<Forwarder> {
    let thread = thread::Builder::new()
        .name(format!("rank{rank}-{}", stream.name()))
        .spawn(move || {
            let prefix = format!("[rank{rank}]: ");
            let reader = BufReader::with_capacity(64 * 1024, pipe);
            let result = forward_lines(reader, prefix.as_bytes(), |line| {
                stream.write_line(line)?;
                progress.fetch_add(line.len() as u64, Ordering::Relaxed);
                Ok(())
            });
            // Returning drops the pipe: if our own stream is closed (say
            // `tensorcomm run ... | head`), the rank then gets EPIPE/SIGPIPE,
            // as it would have writing to the stream itself.
            if let Err(e) = result {
                tracing::debug!(rank, stream = stream.name(), "stopped copying output: {e}");
            }
        })?;
    Ok(Forwarder {
        rank,
        stream,
        thread,
    })
}

/// Read `reader` to its end and hand each line, with `prefix` in front, to
/// `emit` in one call. See the module docs for what counts as a line.
pub fn forward_lines<R: BufRead>(
    mut reader: R,
    prefix: &[u8],
    mut emit: impl FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<()> {
    // Bytes of the line being read that came in earlier chunks.
    let mut pending: Vec<u8> = Vec::new();
    // The last line written ended with '\r'.
    let mut after_cr = false;
    loop {
        let chunk = match reader.fill_buf() {
            Ok(chunk) => chunk,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            break;
        }
        let mut used = 0;
        if after_cr && chunk[0] == b'\n' {
            // The "\n" of a "\r\n" whose "\r" came at the end of the last read.
            emit(b"\n")?;
            used = 1;
        }
        after_cr = false;
        let rest = &chunk[used..];
        match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            Some(end) => {
                let mut take = end + 1;
                if rest[end] == b'\r' {
                    if rest.get(take) == Some(&b'\n') {
                        take += 1;
                    } else {
                        after_cr = take == rest.len();
                    }
                }
                let mut line = Vec::with_capacity(prefix.len() + pending.len() + take);
                line.extend_from_slice(prefix);
                line.append(&mut pending);
                line.extend_from_slice(&rest[..take]);
                used += take;
                reader.consume(used);
                emit(&line)?;
            }
            None => {
                pending.extend_from_slice(rest);
                used += rest.len();
                reader.consume(used);
            }
        }
    }
    if !pending.is_empty() {
        let mut line = Vec::with_capacity(prefix.len() + pending.len() + 1);
        line.extend_from_slice(prefix);
        line.append(&mut pending);
        line.push(b'\n');
        emit(&line)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `input` through a reader that returns at most `chunk` bytes per
    /// read, to exercise lines split across reads.
    fn lines(input: &[u8], chunk: usize) -> Vec<Vec<u8>> {
        struct Chunked<'a>(&'a [u8], usize);
        impl Read for Chunked<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = self.0.len().min(self.1).min(buf.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut out = Vec::new();
        let reader = BufReader::with_capacity(chunk, Chunked(input, chunk));
        forward_lines(reader, b"[r]: ", |line| {
            out.push(line.to_vec());
            Ok(())
        })
        .expect("in-memory reads do not fail");
        out
    }

    #[test]
    fn each_line_gets_one_prefix_whatever_the_read_size() {
        let input = b"one\ntwo\r\nbar 1\rbar 2\r\xff\xfe raw\nlast";
        let expected: Vec<&[u8]> = vec![
            b"[r]: one\n",
            b"[r]: two\r\n",
            b"[r]: bar 1\r",
            b"[r]: bar 2\r",
            b"[r]: \xff\xfe raw\n",
            b"[r]: last\n",
        ];
        for chunk in [1, 2, 3, 5, 64] {
            let got = lines(input, chunk);
            // With reads that split "\r\n", the "\n" comes as its own piece.
            let joined: Vec<u8> = got.concat();
            assert_eq!(joined, expected.concat(), "chunk size {chunk}");
            if chunk >= 64 {
                assert_eq!(got, expected, "chunk size {chunk}");
            }
        }
    }

    #[test]
    fn empty_input_writes_nothing() {
        assert!(lines(b"", 8).is_empty());
    }

    #[test]
    fn a_failing_writer_stops_the_copy() {
        let reader = BufReader::new(&b"a\nb\n"[..]);
        let mut calls = 0;
        let err = forward_lines(reader, b"", |_| {
            calls += 1;
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        })
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        assert_eq!(calls, 1);
    }
}
