//! `FileStore`: a store kept in one file that several processes share.
//!
//! The file is an append-only log of changes (set, delete, append, queue
//! push and pop). Every process holds a replica ([`KvState`]) and, before
//! each operation, replays the records other processes appended since it
//! last looked. Writers take an exclusive lock on the file for
//! read-replay-append, so concurrent writers never interleave and every
//! replica sees the same order. Blocking calls poll the file with a short
//! back-off.
//!
//! The store counts its users in the log. The path must be a regular file
//! or not exist; anything else (a device, a FIFO, a directory) is refused.
//! Whoever creates the file marks the log as created by a store; the last
//! user to drop its `FileStore` then deletes the file, so a path can be
//! reused by the next job. A file the store did not create (an existing
//! empty file, as `tempfile` hands out) is never deleted: the last user
//! truncates it back to empty, as it was given.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::state::KvState;
use super::{check_multi_set, DefaultTimeout, Store};
use crate::{Error, Result};

/// One change in the log.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Op {
    Set = 1,
    Delete = 2,
    Append = 3,
    QueuePush = 4,
    QueuePop = 5,
    Users = 6,
    /// The file was created by a store (so the last user may delete it).
    Created = 7,
}

impl Op {
    fn from_byte(b: u8) -> Option<Op> {
        Some(match b {
            1 => Op::Set,
            2 => Op::Delete,
            3 => Op::Append,
            4 => Op::QueuePush,
            5 => Op::QueuePop,
            6 => Op::Users,
            7 => Op::Created,
            _ => return None,
        })
    }
}

/// The replica and how far into the log it has read.
#[derive(Default)]
struct Replica {
    state: KvState,
    users: i64,
    read_to: u64,
    /// The log says a store created the file.
    created: bool,
}

/// A store in a file, shared by processes that can open the same path.
///
/// ```
/// use tensorcomm::store::{FileStore, Store};
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("rendezvous");
/// let a = FileStore::open(&path)?;
/// let b = FileStore::open(&path)?; // e.g. in another process
/// a.set("rank0/addr", b"127.0.0.1:5000")?;
/// assert_eq!(b.get("rank0/addr")?, b"127.0.0.1:5000");
/// assert_eq!(b.add("arrived", 1)?, 1);
/// assert_eq!(a.add("arrived", 1)?, 2);
/// drop((a, b)); // the last user deletes the file
/// assert!(!path.exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct FileStore {
    path: PathBuf,
    file: Mutex<(File, Replica)>,
    timeout: DefaultTimeout,
}

/// Poll interval bounds for blocking calls.
const POLL_MIN: Duration = Duration::from_micros(200);
const POLL_MAX: Duration = Duration::from_millis(20);

impl FileStore {
    /// Opens (creating if needed) the store at `path` and registers as a user.
    ///
    /// `path` must be a regular file or not exist: anything else is
    /// [`Error::StoreFileNotRegular`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let (file, created) = open_or_create(&path)?;
        let mut replica = Replica::default();
        let mut records = Vec::with_capacity(2);
        if created {
            records.push(record(Op::Created, "", b""));
        }
        records.push(record(Op::Users, "", &1i64.to_le_bytes()));
        {
            // Registered only once this succeeds; until then there is no
            // `FileStore` whose drop would count us out.
            let _lock = FileLock::exclusive(&file, &path)?;
            catch_up(&file, &mut replica, &path)?;
            (&file)
                .write_all(&records.concat())
                .map_err(|e| Error::io(format!("writing file store {}", path.display()), e))?;
            catch_up(&file, &mut replica, &path)?;
        }
        let store = FileStore {
            path,
            file: Mutex::new((file, replica)),
            timeout: DefaultTimeout::default(),
        };
        Ok(store)
    }

    /// The file backing this store.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, (File, Replica)> {
        self.file.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on an up-to-date replica under a shared file lock.
    fn read<T>(&self, f: impl FnOnce(&mut KvState) -> T) -> Result<T> {
        let mut guard = self.lock();
        let (file, replica) = &mut *guard;
        let _lock = FileLock::shared(file, &self.path)?;
        catch_up(file, replica, &self.path)?;
        Ok(f(&mut replica.state))
    }

    /// Under an exclusive lock: catches up, lets `f` decide on records to
    /// append, appends and applies them.
    fn write<T>(&self, f: impl FnOnce(&KvState) -> Result<(T, Vec<Vec<u8>>)>) -> Result<T> {
        let mut guard = self.lock();
        let (file, replica) = &mut *guard;
        let _lock = FileLock::exclusive(file, &self.path)?;
        catch_up(file, replica, &self.path)?;
        let (out, records) = f(&replica.state)?;
        if !records.is_empty() {
            let bytes = records.concat();
            (&*file)
                .write_all(&bytes)
                .map_err(|e| Error::io(format!("writing file store {}", self.path.display()), e))?;
            catch_up(file, replica, &self.path)?;
        }
        Ok(out)
    }

    /// Polls `ready` on a fresh replica until it gives `Some` or time runs out.
    fn poll<T>(
        &self,
        keys: &[&str],
        timeout: Duration,
        mut ready: impl FnMut(&KvState) -> Option<T>,
    ) -> Result<T> {
        let start = Instant::now();
        let mut pause = POLL_MIN;
        loop {
            if let Some(out) = self.read(|s| ready(s))? {
                return Ok(out);
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                return Err(Error::StoreTimeout {
                    keys: keys.iter().map(|k| k.to_string()).collect(),
                    timeout,
                });
            }
            std::thread::sleep(pause.min(timeout - elapsed));
            pause = (pause * 2).min(POLL_MAX);
        }
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        // Best effort throughout: a file that cannot be cleaned up is only
        // clutter. Everything happens under the exclusive lock, so a newcomer
        // either registered before us (and we are not last) or finds the
        // file as we leave it.
        let mut guard = self.lock();
        let (file, replica) = &mut *guard;
        let Ok(_lock) = FileLock::exclusive(file, &self.path) else {
            return;
        };
        let leave = record(Op::Users, "", &(-1i64).to_le_bytes());
        if catch_up(file, replica, &self.path).is_err()
            || (&*file).write_all(&leave).is_err()
            || catch_up(file, replica, &self.path).is_err()
            || replica.users > 0
        {
            return;
        }
        if replica.created {
            // Only if the path still names the file we created.
            let same = match (std::fs::metadata(&self.path), file.metadata()) {
                (Ok(at_path), Ok(ours)) => {
                    (at_path.dev(), at_path.ino()) == (ours.dev(), ours.ino())
                }
                _ => false,
            };
            if same {
                let _ = std::fs::remove_file(&self.path);
            }
        } else {
            // Given to us empty (a log without the created mark only ever
            // grows from an empty file): leave it empty for the next job.
            let _ = file.set_len(0);
        }
    }
}

/// Opens the store file at `path`, creating it if it does not exist; says
/// whether this call created it. Refuses anything but a regular file,
/// before opening it where it can (opening a device or FIFO can block or
/// have effects) and again on the opened file.
fn open_or_create(path: &Path) -> Result<(File, bool)> {
    let io_err = |e| Error::io(format!("opening file store {}", path.display()), e);
    // Another process may create or delete the file between our looks; a
    // few tries settle that (a dangling symlink never settles).
    let mut last = None;
    for _ in 0..8 {
        let opened = match std::fs::metadata(path) {
            Ok(meta) => {
                check_regular(path, &meta)?;
                OpenOptions::new()
                    .read(true)
                    .append(true)
                    .open(path)
                    .map(|f| (f, false))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => OpenOptions::new()
                .read(true)
                .append(true)
                .create_new(true)
                .open(path)
                .map(|f| (f, true)),
            Err(e) => return Err(io_err(e)),
        };
        match opened {
            Ok((file, created)) => {
                check_regular(path, &file.metadata().map_err(io_err)?)?;
                return Ok((file, created));
            }
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::AlreadyExists) => {
                last = Some(e)
            }
            Err(e) => return Err(io_err(e)),
        }
    }
    Err(io_err(last.expect("the loop ran")))
}

fn check_regular(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    let t = meta.file_type();
    if t.is_file() {
        return Ok(());
    }
    let found = if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "something else"
    };
    Err(Error::StoreFileNotRegular {
        path: path.display().to_string(),
        found: found.into(),
    })
}

/// An flock-style lock on the store file, released when dropped.
struct FileLock<'f>(&'f File);

impl<'f> FileLock<'f> {
    fn shared(file: &'f File, path: &Path) -> Result<Self> {
        file.lock_shared()
            .map_err(|e| Error::io(format!("locking file store {}", path.display()), e))?;
        Ok(FileLock(file))
    }

    fn exclusive(file: &'f File, path: &Path) -> Result<Self> {
        file.lock()
            .map_err(|e| Error::io(format!("locking file store {}", path.display()), e))?;
        Ok(FileLock(file))
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// Encodes one log record: op, key length, key, value length, value.
fn record(op: Op, key: &str, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + key.len() + value.len());
    out.push(op as u8);
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(value);
    out
}

/// Reads the records appended since the replica last looked and applies them.
fn catch_up(mut file: &File, replica: &mut Replica, path: &Path) -> Result<()> {
    let io_err = |e| Error::io(format!("reading file store {}", path.display()), e);
    file.seek(SeekFrom::Start(replica.read_to))
        .map_err(io_err)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(io_err)?;
    let mut at = 0usize;
    while at < bytes.len() {
        let (op, key, value, next) = decode(&bytes, at).ok_or_else(|| Error::Protocol {
            expected: format!(
                "a complete record at byte {} of {}",
                replica.read_to + at as u64,
                path.display()
            ),
            found: "a truncated or unknown record (was the file written by something else?)".into(),
        })?;
        apply(replica, op, key, value);
        at = next;
    }
    replica.read_to += bytes.len() as u64;
    Ok(())
}

fn decode(bytes: &[u8], at: usize) -> Option<(Op, &str, &[u8], usize)> {
    let op = Op::from_byte(*bytes.get(at)?)?;
    let (key, at) = field(bytes, at + 1)?;
    let (value, at) = field(bytes, at)?;
    Some((op, std::str::from_utf8(key).ok()?, value, at))
}

fn field(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let len = u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize;
    let start = at + 4;
    Some((bytes.get(start..start + len)?, start + len))
}

fn apply(replica: &mut Replica, op: Op, key: &str, value: &[u8]) {
    let s = &mut replica.state;
    match op {
        Op::Set => s.set(key, value),
        Op::Delete => {
            s.delete(key);
        }
        Op::Append => s.append(key, value),
        Op::QueuePush => s.queue_push(key, value),
        Op::QueuePop => {
            s.queue_pop(key);
        }
        Op::Users => {
            let delta = value.try_into().map(i64::from_le_bytes).unwrap_or(0);
            replica.users += delta;
        }
        Op::Created => replica.created = true,
    }
}

impl Store for FileStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.write(|_| Ok(((), vec![record(Op::Set, key, value)])))
    }

    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.poll(&[key], timeout, |s| s.get(key).map(<[u8]>::to_vec))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.write(|s| {
            let current = match s.get(key) {
                None => 0,
                Some(bytes) => super::state::parse_counter(key, bytes)?,
            };
            let next = super::state::checked_add(key, current, delta)?;
            Ok((
                next,
                vec![record(Op::Set, key, next.to_string().as_bytes())],
            ))
        })
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.write(|s| {
            let swap = match s.get(key) {
                None => expected.is_empty(),
                Some(current) => current == expected,
            };
            Ok(match (swap, s.get(key)) {
                (true, _) => (desired.to_vec(), vec![record(Op::Set, key, desired)]),
                (false, Some(current)) => (current.to_vec(), vec![]),
                (false, None) => (expected.to_vec(), vec![]),
            })
        })
    }

    fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.poll(keys, timeout, |s| s.missing(keys).is_empty().then_some(()))
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.read(|s| s.missing(keys).is_empty())
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        self.write(|s| {
            let existed = s.get(key).is_some();
            let records = if existed {
                vec![record(Op::Delete, key, b"")]
            } else {
                vec![]
            };
            Ok((existed, records))
        })
    }

    fn num_keys(&self) -> Result<usize> {
        self.read(|s| s.num_keys())
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.write(|_| Ok(((), vec![record(Op::Append, key, value)])))
    }

    fn multi_get_timeout(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        self.poll(keys, timeout, |s| {
            keys.iter()
                .map(|k| s.get(k).map(<[u8]>::to_vec))
                .collect::<Option<Vec<_>>>()
        })
    }

    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<()> {
        check_multi_set(keys, values)?;
        let records = keys
            .iter()
            .zip(values)
            .map(|(k, v)| record(Op::Set, k, v))
            .collect();
        self.write(|_| Ok(((), records)))
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        self.read(|s| s.list_keys())
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.write(|_| Ok(((), vec![record(Op::QueuePush, key, value)])))
    }

    fn queue_pop_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let start = Instant::now();
        let mut pause = POLL_MIN;
        loop {
            // Under the exclusive lock the front is ours: replicas apply the
            // pop record in log order, so no one else gets this element.
            let popped = self.write(|s| {
                Ok(match s.queue_front(key) {
                    Some(front) => (Some(front.to_vec()), vec![record(Op::QueuePop, key, b"")]),
                    None => (None, vec![]),
                })
            })?;
            if let Some(value) = popped {
                return Ok(value);
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                return Err(Error::StoreTimeout {
                    keys: vec![key.to_string()],
                    timeout,
                });
            }
            std::thread::sleep(pause.min(timeout - elapsed));
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    fn queue_len(&self, key: &str) -> Result<usize> {
        self.read(|s| s.queue_len(key))
    }

    fn timeout(&self) -> Duration {
        self.timeout.get()
    }

    fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_a_store_log_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not-a-store");
        std::fs::write(&path, b"hello, I am a text file").unwrap();
        let err = FileStore::open(&path)
            .err()
            .expect("opening garbage must fail");
        assert!(matches!(err, Error::Protocol { .. }), "{err:?}");
        assert!(err.to_string().contains("not-a-store"), "{err}");
    }

    #[test]
    fn the_log_replays_deletes_appends_and_queue_pops_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let a = FileStore::open(&path).unwrap();
        a.set("k", b"1").unwrap();
        a.append("k", b"2").unwrap();
        a.set("gone", b"x").unwrap();
        assert!(a.delete_key("gone").unwrap());
        a.queue_push("q", b"first").unwrap();
        a.queue_push("q", b"second").unwrap();
        assert_eq!(a.queue_pop("q").unwrap(), b"first");
        // A newcomer replays the whole log and sees the same state.
        let b = FileStore::open(&path).unwrap();
        assert_eq!(b.get("k").unwrap(), b"12");
        assert!(!b.check(&["gone"]).unwrap());
        assert_eq!(b.queue_len("q").unwrap(), 1);
        assert_eq!(b.queue_pop("q").unwrap(), b"second");
        assert_eq!(a.queue_len("q").unwrap(), 0);
        drop(a);
        assert!(path.exists(), "one user left");
        drop(b);
        assert!(!path.exists(), "the last user removes the file");
    }
}
