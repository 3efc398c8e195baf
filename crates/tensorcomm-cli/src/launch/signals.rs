//! Signals: catching the ones the launcher forwards, sending them to ranks,
//! and naming them in messages.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use libc::c_int;
use signal_hook::SigId;

/// Signals that stop the job; each is forwarded to every running rank.
pub const FORWARDED: [c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// While alive, catches [`FORWARDED`] signals instead of dying of them; the
/// supervisor picks them up with [`SignalWatch::take`] on its next poll.
pub struct SignalWatch {
    pending: Arc<AtomicUsize>,
    ids: Vec<SigId>,
}

impl SignalWatch {
    /// Install the handlers.
    pub fn install() -> io::Result<Self> {
        let pending = Arc::new(AtomicUsize::new(0));
        let mut watch = SignalWatch {
            pending: pending.clone(),
            ids: Vec::new(),
        };
        for signal in FORWARDED {
            // The handler only stores the signal's number: async-signal-safe.
            let id = signal_hook::flag::register_usize(signal, pending.clone(), signal as usize)?;
            watch.ids.push(id);
        }
        Ok(watch)
    }

    /// The signal caught since the last call, if any (the latest one when
    /// several arrived in between).
    pub fn take(&self) -> Option<c_int> {
        match self.pending.swap(0, Ordering::SeqCst) {
            0 => None,
            signal => c_int::try_from(signal).ok(),
        }
    }
}

impl Drop for SignalWatch {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Send `signal` to the process group led by `pid`, the rank and everything
/// it started. Falls back to the process alone if the group is gone (the rank
/// moved itself to another group). `pid` must be a child that has not been
/// reaped yet, so that the number cannot belong to another process.
pub fn send_to_rank(pid: u32, signal: c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("pid {pid} does not fit in pid_t"),
        )
    })?;
    if kill(-pid, signal).is_ok() {
        return Ok(());
    }
    kill(pid, signal)
}

fn kill(target: libc::pid_t, signal: c_int) -> io::Result<()> {
    // SAFETY: kill(2) takes two integers and reads or writes no memory of
    // ours; which process it reaches is the caller's contract (see above).
    let rc = unsafe { libc::kill(target, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `SIGTERM` for 15; `None` for numbers without a common name.
pub fn name(signal: c_int) -> Option<&'static str> {
    Some(match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

/// `signal 9 (SIGKILL)`, or `signal 40` for one without a name.
pub fn describe(signal: c_int) -> String {
    match name(signal) {
        Some(name) => format!("signal {signal} ({name})"),
        None => format!("signal {signal}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_described_by_number_and_name() {
        assert_eq!(describe(libc::SIGKILL), "signal 9 (SIGKILL)");
        assert_eq!(describe(libc::SIGTERM), "signal 15 (SIGTERM)");
        assert_eq!(describe(1000), "signal 1000");
    }
}
