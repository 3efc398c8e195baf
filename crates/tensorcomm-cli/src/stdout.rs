//! Standard output that ends quietly when its reader goes away
//! (`tensorcomm bench | head`).
//!
//! Rust ignores SIGPIPE, so a write to a closed pipe is an error, and
//! `println!` turns it into a panic: a rank that panics mid-job leaves the
//! others failing their next collective, dumping flight recorders. Every
//! line the commands print goes through a [`Stdout`] instead, which notes
//! the failed write, prints nothing more and lets the caller go on or stop
//! as it likes; the job still exits with its usual status (0 when
//! everything was correct). A job whose rank 0 alone prints asks
//! [`Stdout::agree_open`] between rows, so that every rank stops at the
//! same row instead of timing rows nobody reads.

use std::fmt;
use std::io::Write;

use tensorcomm::tensor::{Device, Tensor};
use tensorcomm::{ProcessGroup, ReduceOp};

/// This process's standard output, until a write to it fails.
pub struct Stdout {
    open: bool,
}

impl Stdout {
    /// The output of a process that prints (`printing`), or of one that
    /// never does (a rank other than 0 of a bench).
    pub fn new(printing: bool) -> Self {
        Stdout { open: printing }
    }

    /// Writes one line (a newline is added) if still open; a failed write
    /// closes it.
    pub fn line(&mut self, text: fmt::Arguments<'_>) {
        if self.open {
            let mut out = std::io::stdout().lock();
            self.open = writeln!(out, "{text}").and_then(|()| out.flush()).is_ok();
        }
    }

    /// Whether this process prints and no write has failed yet.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Whether rank 0's stdout is still open, agreed by every rank of
    /// `pg` (MIN of a flag that only rank 0 can clear), with the flag on
    /// `device` (a CUDA device for a NCCL group). A collective: every rank
    /// calls it at the same point.
    pub fn agree_open(&self, pg: &dyn ProcessGroup, device: Device) -> tensorcomm::Result<bool> {
        let flag = i32::from(self.open || pg.rank() != 0);
        let flag = Tensor::from_vec(vec![flag], &[1])?.into_device(device)?;
        pg.all_reduce(&flag, ReduceOp::Min, None)?.synchronize()?;
        Ok(flag.to_vec::<i32>()?[0] == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_does_not_print_is_closed_from_the_start() {
        let mut quiet = Stdout::new(false);
        quiet.line(format_args!("never written"));
        assert!(!quiet.is_open());
        assert!(Stdout::new(true).is_open());
    }
}
