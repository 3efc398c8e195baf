//! Reclaiming the names of segments that ended processes left in
//! `/dev/shm`. A name lives only while a group is being set up (it is
//! unlinked once every rank has mapped the segment), so names outlive
//! their job only when a process dies during set-up: SIGKILL, or SIGTERM
//! from a launcher stopping the job.
//!
//! Names carry their creator's pid (`/tc<kind>.<pid>.<seq>.<nanos>...`).
//! [`reclaim_orphans`] removes those whose creator is gone and that are
//! older than a set-up takes: for a pair link (`tcshm.`), no process holds
//! the creator's lock on its first byte any more (which holds across pid
//! namespaces); for group segments, no process has the creator's pid.
//! [`remove_segments_of`] removes the names of processes known to have
//! ended (the launcher's ranks).

use std::time::Duration;

use super::segment::{self, Segment};

/// Where POSIX shared-memory names live.
const SHM_DIR: &str = "/dev/shm";

/// The creator's pid of a name made by tensorcomm, and whether it is a
/// pair link's (which its creator locks).
fn parse(file_name: &str) -> Option<(u32, bool)> {
    let rest = file_name.strip_prefix("tc")?;
    let (kind, rest) = rest.split_once('.')?;
    if kind.is_empty() || !kind.bytes().all(|b| b.is_ascii_lowercase()) {
        return None;
    }
    let (pid, _) = rest.split_once('.')?;
    Some((pid.parse().ok()?, kind == "shm"))
}

/// True when no process has pid `pid` (in this pid namespace).
fn pid_gone(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks whether the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Names in `/dev/shm` made by tensorcomm: (file name, creator pid, pair
/// link), with their age.
fn tensorcomm_names() -> Vec<(String, u32, bool, Duration)> {
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let name = entry.file_name().into_string().ok()?;
        let (pid, link) = parse(&name)?;
        let age = entry
            .metadata()
            .ok()?
            .modified()
            .ok()?
            .elapsed()
            .unwrap_or_default();
        Some((name, pid, link, age))
    })
    .collect()
}

/// Removes the names whose creator is gone and that are at least
/// `min_age` old; gives the names removed.
pub fn reclaim_orphans(min_age: Duration) -> Vec<String> {
    let mut removed = Vec::new();
    for (name, pid, link, age) in tensorcomm_names() {
        if age < min_age {
            continue;
        }
        let path = format!("/{name}");
        let orphaned = if link {
            // The creator locks byte 0 for as long as it lives.
            match Segment::open(&path) {
                Ok(seg) => matches!(seg.byte_locked_elsewhere(0), Ok(false)),
                Err(_) => false,
            }
        } else {
            pid_gone(pid)
        };
        if orphaned && segment::unlink(&path).is_ok() {
            removed.push(name);
        }
    }
    if !removed.is_empty() {
        tracing::info!(count = removed.len(), names = ?removed, "removed shared-memory names left by ended processes");
    }
    removed
}

/// Removes every name created by one of `pids` (processes that have
/// ended); gives the names removed.
pub fn remove_segments_of(pids: &[u32]) -> Vec<String> {
    let mut removed = Vec::new();
    for (name, pid, _, _) in tensorcomm_names() {
        if pids.contains(&pid) && segment::unlink(&format!("/{name}")).is_ok() {
            removed.push(name);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pid of a process that has ended.
    fn ended_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    fn age(name: &str, by: Duration) {
        let file = std::fs::File::options()
            .write(true)
            .open(format!("{SHM_DIR}/{name}"))
            .unwrap();
        file.set_modified(std::time::SystemTime::now() - by)
            .unwrap();
    }

    fn exists(name: &str) -> bool {
        std::path::Path::new(&format!("{SHM_DIR}/{name}")).exists()
    }

    #[test]
    fn names_parse_to_their_creator() {
        assert_eq!(parse("tcshm.123.0.0000abcd.0-1"), Some((123, true)));
        assert_eq!(parse("tcarena.77.3.deadbeef"), Some((77, false)));
        assert_eq!(parse("tcshm-test.9.tag"), None);
        assert_eq!(parse("other.1.2"), None);
        assert_eq!(parse("tc.1.2"), None);
    }

    #[test]
    fn orphans_of_ended_processes_are_removed_and_the_living_kept() {
        let dead = ended_pid();
        let me = std::process::id();
        let old = Duration::from_secs(600);
        // A pair link whose creator ended (nobody holds its lock), old.
        let dead_link = format!("tcshm.{dead}.0.00000001.0-1");
        let _a = Segment::create(&format!("/{dead_link}"), 4096).unwrap();
        age(&dead_link, old);
        // A pair link whose creator (this process) lives and holds its lock.
        let live_link = format!("tcshm.{me}.990001.00000002.0-1");
        let b = Segment::create(&format!("/{live_link}"), 4096).unwrap();
        b.lock_byte(0).unwrap();
        age(&live_link, old);
        // A group segment of an ended process, old; and one too young.
        let dead_group = format!("tcarena.{dead}.0.00000003");
        let _c = Segment::create(&format!("/{dead_group}"), 4096).unwrap();
        age(&dead_group, old);
        let young = format!("tcarena.{dead}.1.00000004");
        let _d = Segment::create(&format!("/{young}"), 4096).unwrap();

        let removed = reclaim_orphans(Duration::from_secs(60));
        assert!(removed.contains(&dead_link), "{removed:?}");
        assert!(removed.contains(&dead_group), "{removed:?}");
        assert!(!exists(&dead_link) && !exists(&dead_group));
        assert!(exists(&live_link), "a living creator's name stays");
        assert!(exists(&young), "a name younger than a set-up stays");

        // The launcher removes what its ended ranks left, whatever the age.
        assert_eq!(remove_segments_of(&[dead]), vec![young.clone()]);
        assert!(!exists(&young));
        segment::unlink(&format!("/{live_link}")).unwrap();
    }
}
