//! Rank output with a `[rankN]: ` prefix on every line, and the one lock
//! under which everything the launcher prints goes out.
//!
//! A [`LineSplitter`] turns the bytes one rank writes to one stream into
//! whole lines, prefix included. Bytes are passed through as they are (no
//! UTF-8 decoding). A carriage return also ends a line, so progress bars
//! that redraw with `\r` show up as they are drawn; a `\r\n` is one line. A
//! last line without a newline is written with one added.
//!
//! Every write, of a rank's line or of a launcher message, takes
//! [`OUTPUT`] and writes the whole line before releasing it: with stdout
//! and stderr on one pipe or file (`2>&1`), a line longer than the pipe
//! holds takes several writes, and no other line may come between them.

use std::io::{self, Write};
use std::sync::Mutex;

/// Held while one whole line goes out on our stdout or stderr.
static OUTPUT: Mutex<()> = Mutex::new(());

/// Which of our streams a child's pipe is copied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
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

    /// Write one whole line, with nothing else printed by this process
    /// coming between its bytes.
    pub fn write_line(self, line: &[u8]) -> io::Result<()> {
        let _whole = OUTPUT
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
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

/// Print `tensorcomm run: {message}` on stderr as one whole line.
pub fn launcher_line(message: &str) {
    let line = format!("tensorcomm run: {message}\n");
    // Nothing more to do if our own stderr is gone.
    let _ = Stream::Stderr.write_line(line.as_bytes());
}

/// Splits what one rank writes to one stream into prefixed whole lines.
#[derive(Debug)]
pub struct LineSplitter {
    prefix: Vec<u8>,
    /// The line being read, prefix included once it has any byte.
    pending: Vec<u8>,
    /// `pending` is a whole line ending in `\r`, held back until the next
    /// byte says whether a `\n` belongs to it.
    held_cr: bool,
}

impl LineSplitter {
    /// A splitter putting `prefix` in front of every line.
    pub fn new(prefix: impl Into<Vec<u8>>) -> Self {
        LineSplitter {
            prefix: prefix.into(),
            pending: Vec::new(),
            held_cr: false,
        }
    }

    /// Take the next bytes the rank wrote; hand each line they complete,
    /// prefixed, to `emit` in one call.
    pub fn feed(
        &mut self,
        mut chunk: &[u8],
        emit: &mut impl FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        if self.held_cr && !chunk.is_empty() {
            self.held_cr = false;
            if chunk[0] == b'\n' {
                self.pending.push(b'\n');
                chunk = &chunk[1..];
            }
            self.emit_pending(emit)?;
        }
        while let Some(end) = chunk.iter().position(|&b| b == b'\n' || b == b'\r') {
            let mut take = end + 1;
            if chunk[end] == b'\r' && chunk.get(take) == Some(&b'\n') {
                take += 1;
            }
            self.start_line();
            self.pending.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if take == end + 1 && chunk.is_empty() && self.pending.last() == Some(&b'\r') {
                // A `\r` at the end of a read: its `\n` may come in the next.
                self.held_cr = true;
                return Ok(());
            }
            self.emit_pending(emit)?;
        }
        if !chunk.is_empty() {
            self.start_line();
            self.pending.extend_from_slice(chunk);
        }
        Ok(())
    }

    /// The rank's stream ended: hand out what is left, a last line without
    /// a newline getting one.
    pub fn finish(&mut self, emit: &mut impl FnMut(&[u8]) -> io::Result<()>) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        if !self.held_cr {
            self.pending.push(b'\n');
        }
        self.held_cr = false;
        self.emit_pending(emit)
    }

    fn start_line(&mut self) {
        if self.pending.is_empty() {
            self.pending.extend_from_slice(&self.prefix);
        }
    }

    fn emit_pending(&mut self, emit: &mut impl FnMut(&[u8]) -> io::Result<()>) -> io::Result<()> {
        let result = emit(&self.pending);
        self.pending.clear();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `input` in pieces of at most `chunk` bytes.
    fn lines(input: &[u8], chunk: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut emit = |line: &[u8]| {
            out.push(line.to_vec());
            Ok(())
        };
        let mut splitter = LineSplitter::new(*b"[r]: ");
        for piece in input.chunks(chunk) {
            splitter.feed(piece, &mut emit).expect("in-memory");
        }
        splitter.finish(&mut emit).expect("in-memory");
        out
    }

    #[test]
    fn each_line_gets_one_prefix_and_comes_whole_whatever_the_read_size() {
        let input = b"one\ntwo\r\nbar 1\rbar 2\r\xff\xfe raw\nlast";
        let expected: Vec<&[u8]> = vec![
            b"[r]: one\n",
            b"[r]: two\r\n",
            b"[r]: bar 1\r",
            b"[r]: bar 2\r",
            b"[r]: \xff\xfe raw\n",
            b"[r]: last\n",
        ];
        for chunk in [1, 2, 3, 4, 5, 64] {
            assert_eq!(lines(input, chunk), expected, "chunk size {chunk}");
        }
    }

    #[test]
    fn a_last_carriage_return_line_is_written_as_it_is() {
        assert_eq!(lines(b"50%\r", 2), vec![b"[r]: 50%\r".to_vec()]);
    }

    #[test]
    fn empty_input_writes_nothing() {
        assert!(lines(b"", 8).is_empty());
    }

    #[test]
    fn a_failing_writer_stops_the_copy() {
        let mut calls = 0;
        let mut splitter = LineSplitter::new(Vec::new());
        let err = splitter
            .feed(b"a\nb\n", &mut |_| {
                calls += 1;
                Err(io::Error::from(io::ErrorKind::BrokenPipe))
            })
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        assert_eq!(calls, 1);
    }
}
