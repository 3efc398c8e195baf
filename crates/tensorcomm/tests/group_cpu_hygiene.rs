//! Creating and destroying CPU groups leaks nothing: after many groups
//! (2 ranks as threads, over shared memory and over TCP, each running one
//! all-reduce), this process has the same open file descriptors, the same
//! threads and the same shared-memory segments of its own as before.
//! Linux only (it counts through /proc and /dev/shm). One test in its own
//! binary, so no other test's resources come and go meanwhile.

#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{groups_over, on_every_rank};
use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::HashStore;
use tensorcomm::tensor::Tensor;

/// Groups of each transport.
const GROUPS: usize = 100;

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Counts {
    fds: usize,
    threads: usize,
    shm: usize,
}

fn entries(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

/// This process's shared-memory segments: every name tensorcomm gives one
/// starts with "tc" and carries the creating process's id.
fn own_shm_segments() -> usize {
    let pid = format!(".{}.", std::process::id());
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("tc") && name.contains(&pid)
        })
        .count()
}

fn counts() -> Counts {
    Counts {
        fds: entries("/proc/self/fd"),
        threads: entries("/proc/self/task"),
        shm: own_shm_segments(),
    }
}

/// Creates a group over `choice`, all-reduces once on every rank and
/// destroys it.
fn one_group(store: &Arc<HashStore>, prefix: &str, choice: TransportChoice) {
    let pgs = groups_over(2, store, prefix, choice);
    let sums = on_every_rank(&pgs, |pg| {
        let t = Tensor::from_vec(vec![pg.rank() as f32 + 1.0; 4], &[4]).unwrap();
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        t.to_vec::<f32>().unwrap()
    });
    assert!(sums.iter().all(|s| s == &[3.0; 4]), "{sums:?}");
    drop(pgs);
}

/// Counts once they stop changing (threads of a dropped group may still
/// be on their way out for a moment): the same over 5 samples 30 ms apart,
/// and equal to `want` when given; the last sample after 3 s.
fn settled_counts(want: Option<Counts>) -> Counts {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut last = counts();
    let mut same = 0;
    loop {
        std::thread::sleep(Duration::from_millis(30));
        let now = counts();
        same = if now == last { same + 1 } else { 0 };
        last = now;
        let wanted = want.is_none_or(|w| w == now);
        if (same >= 4 && wanted) || Instant::now() > deadline {
            return now;
        }
    }
}

#[test]
fn creating_and_destroying_groups_leaks_no_fds_threads_or_segments() {
    let store = Arc::new(HashStore::new());
    // Warm-up: anything a process sets up once, on its first group, is
    // in the baseline.
    for choice in [TransportChoice::Shm, TransportChoice::Tcp] {
        one_group(&store, &format!("warm-{choice}"), choice);
    }
    let before = settled_counts(None);
    // The counts see a live group's resources (not its shared-memory
    // segments: they are unlinked once every rank has mapped them, so
    // /dev/shm shows only segments left behind, which is what counts).
    let live = groups_over(2, &store, "live", TransportChoice::Shm);
    let during = counts();
    assert!(
        during.fds > before.fds && during.threads > before.threads,
        "{during:?}"
    );
    drop(live);
    let started = Instant::now();
    for i in 0..GROUPS {
        for choice in [TransportChoice::Shm, TransportChoice::Tcp] {
            one_group(&store, &format!("g{i}-{choice}"), choice);
        }
    }
    let after = settled_counts(Some(before));
    assert_eq!(
        after,
        before,
        "after {} groups ({:?})",
        2 * GROUPS,
        started.elapsed()
    );
}
