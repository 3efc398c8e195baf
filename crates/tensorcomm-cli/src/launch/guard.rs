//! Ending the ranks' whole process trees when the launcher dies hard.
//!
//! Each rank leads its own process group and gets SIGKILL from the kernel
//! when the launcher dies (`PR_SET_PDEATHSIG`), but that signal reaches only
//! the rank itself: what the rank started (a `sh -c` script's commands, data
//! loader workers) would be reparented and keep running after a `kill -9`
//! of the launcher. So the launcher forks a small guardian before starting
//! ranks. It reads the ranks' process-group ids from a pipe; when the pipe
//! reaches end of file without the launcher's "done" (the launcher died:
//! the kernel closed its end), it sends SIGKILL to every group it was told
//! about, removes the job's exits file (see [`super::exits_file`]), then
//! exits. A group keeps its id while any process of it lives, so the id
//! still names the rank's tree.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The most ranks one guardian watches (the rest are only covered by the
/// parent-death signal).
const CAPACITY: usize = 4096;
/// The record that says the launcher ended normally.
const DONE: i32 = 0;

/// The launcher's end of the guardian's pipe.
pub struct TreeGuard {
    pipe: File,
    pid: libc::pid_t,
}

impl TreeGuard {
    /// Forks the guardian; `remove` is a file it removes if the launcher
    /// dies.
    pub fn start(remove: Option<&Path>) -> io::Result<Self> {
        // Made before the fork: the child may not allocate.
        let remove = remove.and_then(|p| CString::new(p.as_os_str().as_bytes()).ok());
        let mut fds: [RawFd; 2] = [-1; 2];
        // SAFETY: `fds` is a valid array of two file descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let (read, write) = (fds[0], fds[1]);
        // Allocated before the fork: the child may not allocate.
        let mut groups = vec![0 as libc::pid_t; CAPACITY];
        // SAFETY: the child runs only async-signal-safe system calls
        // (close, setpgid, read, kill, unlink, _exit) on memory allocated
        // before the fork, and never returns.
        match unsafe { libc::fork() } {
            -1 => {
                let e = io::Error::last_os_error();
                unsafe {
                    libc::close(read);
                    libc::close(write);
                }
                Err(e)
            }
            0 => unsafe { guardian(read, &mut groups, remove.as_deref()) },
            pid => {
                // SAFETY: `write` is ours alone from here on.
                unsafe { libc::close(read) };
                Ok(TreeGuard {
                    pipe: unsafe { File::from_raw_fd(write) },
                    pid,
                })
            }
        }
    }

    /// Watches the process group led by `pgid` (a rank's pid).
    pub fn watch(&mut self, pgid: u32) {
        if let Ok(pgid) = i32::try_from(pgid) {
            if let Err(e) = self.pipe.write_all(&pgid.to_ne_bytes()) {
                tracing::debug!(pgid, "cannot tell the guardian about a rank: {e}");
            }
        }
    }

    /// The launcher ended normally (it stopped and reaped its ranks itself):
    /// the guardian exits without killing anything.
    pub fn done(mut self) {
        let _ = self.pipe.write_all(&DONE.to_ne_bytes());
        drop(self.pipe);
        // It exits at once on "done" (or on EOF): reap it.
        // SAFETY: `pid` is our unreaped child.
        unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
    }
}

/// The guardian's whole life, in the forked child.
unsafe fn guardian(read: RawFd, groups: &mut [libc::pid_t], remove: Option<&CStr>) -> ! {
    // Hold no other descriptor of the launcher's (its output pipes, the
    // write end of our own pipe), so readers of those see EOF when the
    // launcher and its ranks are gone; and leave the terminal's process
    // group, so a Ctrl-C goes to the launcher, which forwards it.
    for fd in 0..1024 {
        if fd != read {
            libc::close(fd);
        }
    }
    libc::setpgid(0, 0);
    let mut known = 0usize;
    let mut record = [0u8; 4];
    let mut have = 0usize;
    loop {
        let n = libc::read(
            read,
            record[have..].as_mut_ptr().cast(),
            record.len() - have,
        );
        if n < 0 && *libc::__errno_location() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            break;
        }
        have += n as usize;
        if have < record.len() {
            continue;
        }
        have = 0;
        match i32::from_ne_bytes(record) {
            DONE => libc::_exit(0),
            pgid if known < groups.len() => {
                groups[known] = pgid;
                known += 1;
            }
            _ => {}
        }
    }
    // End of file without "done": the launcher died.
    for &pgid in &groups[..known] {
        libc::kill(-pgid, libc::SIGKILL);
    }
    if let Some(path) = remove {
        libc::unlink(path.as_ptr());
    }
    libc::_exit(0)
}
