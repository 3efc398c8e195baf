//! A POSIX shared-memory segment: create or open it by name, map it, lock a
//! byte of it, unlink its name. The only file here that calls the OS.
//!
//! Liveness rides on open-file-description locks (`F_OFD_SETLK`): each side
//! write-locks one byte of the segment through its own descriptor, and the
//! kernel drops that lock when the process exits, however it exits. The
//! peer asks with `F_OFD_GETLK` whether the byte is still locked. Unlike
//! `kill(pid, 0)` this is not fooled by zombies (a dead child whose parent
//! has not reaped it yet), reused pids or separate pid namespaces, and it
//! keeps working after the name is unlinked. Descriptors from `shm_open`
//! are close-on-exec, so a child started with `exec` does not inherit it.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// A mapped shared-memory segment. Unmapped (and its descriptor closed,
/// which releases its lock) on drop; the name is left to [`unlink`]. A
/// segment that needs no locks may close its descriptor early
/// ([`Segment::close_descriptor`]); the mapping stays.
pub(super) struct Segment {
    fd: Option<OwnedFd>,
    ptr: NonNull<u8>,
    len: usize,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("len", &self.len)
            .field("descriptor_open", &self.fd.is_some())
            .finish()
    }
}

// SAFETY: a Segment owns its mapping and descriptor; nothing about them is
// tied to the thread that created them.
unsafe impl Send for Segment {}
// SAFETY: `&Segment` only hands out the base pointer and makes fcntl calls
// on the descriptor, both fine from several threads.
unsafe impl Sync for Segment {}

fn c_name(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))
}

/// Turns a `-1` return into the thread's `errno`.
fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

impl Segment {
    /// Creates the segment `name` (which must not exist) of `len` zeroed
    /// bytes and maps it. Fails with `AlreadyExists` if the name is taken.
    pub fn create(name: &str, len: usize) -> io::Result<Segment> {
        let cname = c_name(name)?;
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;
        // SAFETY: cname is a valid NUL-terminated string.
        let fd = check(unsafe { libc::shm_open(cname.as_ptr(), flags, 0o600) })?;
        // SAFETY: fd was just returned by shm_open and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let sized = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))
            // SAFETY: ftruncate on a descriptor we own.
            .and_then(|len| check(unsafe { libc::ftruncate(fd.as_raw_fd(), len) }).map(|_| len));
        // Reserves the pages now: on a full `/dev/shm` this fails with
        // ENOSPC, where a sparse segment would fail later with SIGBUS on
        // first touch. Filesystems without fallocate keep the sparse one.
        let reserved = sized.and_then(|len| {
            // SAFETY: posix_fallocate on a descriptor we own.
            match unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, len) } {
                0 | libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
                errno => Err(io::Error::from_raw_os_error(errno)),
            }
        });
        match reserved.and_then(|_| Segment::map(fd, len)) {
            Ok(seg) => Ok(seg),
            Err(e) => {
                let _ = unlink(name);
                Err(e)
            }
        }
    }

    /// Opens the existing segment `name` and maps all of it.
    pub fn open(name: &str) -> io::Result<Segment> {
        let cname = c_name(name)?;
        // SAFETY: cname is a valid NUL-terminated string.
        let fd = check(unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) })?;
        // SAFETY: fd was just returned by shm_open and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero `stat` is a valid value for fstat to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open and st is a valid out-pointer.
        check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
        let len = usize::try_from(st.st_size)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "negative segment size"))?;
        Segment::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<Segment> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "empty segment"));
        }
        // SAFETY: a fresh shared mapping of an open descriptor; the kernel
        // picks the address, so no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null pointer"))?;
        Ok(Segment {
            fd: Some(fd),
            ptr,
            len,
        })
    }

    /// The start of the mapping (page aligned), valid while self lives.
    pub fn base(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The mapping's length in bytes (the segment's size when mapped).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Closes the descriptor now, keeping the mapping: for segments whose
    /// liveness nobody checks, so that many of them do not use up the
    /// process's descriptors. Byte locks fail afterwards.
    pub fn close_descriptor(&mut self) {
        self.fd = None;
    }

    /// The open descriptor, for locks.
    fn fd(&self) -> io::Result<libc::c_int> {
        self.fd.as_ref().map(AsRawFd::as_raw_fd).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "segment descriptor already closed: byte locks need it open",
            )
        })
    }

    fn byte_lock(&self, kind: libc::c_int, byte: usize) -> libc::flock {
        // SAFETY: an all-zero `flock` is valid; OFD locks require l_pid 0.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = byte as libc::off_t;
        fl.l_len = 1;
        fl
    }

    /// Write-locks `byte` through this descriptor until it is closed.
    pub fn lock_byte(&self, byte: usize) -> io::Result<()> {
        let fl = self.byte_lock(libc::F_WRLCK, byte);
        // SAFETY: fcntl on a descriptor we own with a valid flock.
        check(unsafe { libc::fcntl(self.fd()?, libc::F_OFD_SETLK, &fl) })?;
        Ok(())
    }

    /// Whether another descriptor (another process, or another open of the
    /// segment in this one) holds a lock on `byte`.
    pub fn byte_locked_elsewhere(&self, byte: usize) -> io::Result<bool> {
        let mut fl = self.byte_lock(libc::F_WRLCK, byte);
        // SAFETY: fcntl on a descriptor we own with a valid, writable flock.
        check(unsafe { libc::fcntl(self.fd()?, libc::F_OFD_GETLK, &mut fl) })?;
        Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: ptr/len are the mapping made in `map`, unmapped only here;
        // every pointer into it lives in structs that own this Segment.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Removes the name `name`; mappings stay valid. A missing name is fine.
pub(super) fn unlink(name: &str) -> io::Result<()> {
    let cname = c_name(name)?;
    // SAFETY: cname is a valid NUL-terminated string.
    match check(unsafe { libc::shm_unlink(cname.as_ptr()) }) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other.map(|_| ()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unique(tag: &str) -> String {
        format!("/tcshm-test.{}.{tag}", std::process::id())
    }

    #[test]
    fn create_open_share_bytes_and_unlink() {
        let name = unique("share");
        let a = Segment::create(&name, 8192).unwrap();
        let b = Segment::open(&name).unwrap();
        assert_eq!(b.len(), 8192);
        let err = Segment::create(&name, 8192).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        unlink(&name).unwrap();
        unlink(&name).unwrap(); // already gone: fine
        assert_eq!(
            Segment::open(&name).err().unwrap().kind(),
            io::ErrorKind::NotFound
        );
        // SAFETY: both mappings are 8192 bytes long and alive.
        unsafe {
            a.base().as_ptr().add(5000).write_volatile(0xAB);
            assert_eq!(b.base().as_ptr().add(5000).read_volatile(), 0xAB);
        }
    }

    #[test]
    fn ofd_locks_show_whether_the_holder_is_open() {
        let name = unique("lock");
        let a = Segment::create(&name, 4096).unwrap();
        let b = Segment::open(&name).unwrap();
        unlink(&name).unwrap();
        assert!(!b.byte_locked_elsewhere(0).unwrap());
        a.lock_byte(0).unwrap();
        b.lock_byte(1).unwrap();
        assert!(b.byte_locked_elsewhere(0).unwrap());
        assert!(a.byte_locked_elsewhere(1).unwrap());
        assert!(!a.byte_locked_elsewhere(0).unwrap()); // its own lock
        drop(a);
        assert!(!b.byte_locked_elsewhere(0).unwrap());
    }
}
