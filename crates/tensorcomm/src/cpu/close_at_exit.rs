//! A process that exits closes its CPU groups' connections before its
//! hosting store serves the others' last requests (`process_exit.rs`).
//!
//! A process that exits without dropping its groups (`std::process::exit`,
//! a group held by a static) keeps every connection open for as long as
//! its store lingers. Peers blocked in a collective with it would then
//! wait out their timeout instead of failing at once on a closed
//! connection, which the kernel would have given them had the store not
//! kept the process alive. So every CPU group registers its backend here,
//! and at exit each one still alive is aborted as a failed collective
//! aborts it: its links are closed (shared memory: the closed flag; TCP:
//! both directions shut down), and peers waiting on this rank fail naming
//! it. Only host connections: device resources are left to the process's
//! end.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::group_backend::CpuBackend;
use crate::process_exit::{lock_within, on_exit, ExitStage};

/// The longest the exit hook tries for the registry's lock.
const PATIENCE: Duration = Duration::from_secs(1);

/// The backend of every CPU group created in this process, with the id
/// of the process that created it (a forked child holds a copy of its
/// parent's registry, whose groups are not its own).
static GROUPS: Mutex<Vec<(u32, Weak<CpuBackend>)>> = Mutex::new(Vec::new());
/// The process that last registered a group (0: none): a forked child
/// that registered none takes no lock at exit.
static REGISTERING_PID: AtomicU32 = AtomicU32::new(0);

/// Closes `backend`'s connections if the process exits while it lives.
pub(crate) fn register(backend: &Arc<CpuBackend>) {
    {
        let mut groups = GROUPS.lock().unwrap_or_else(|p| p.into_inner());
        groups.retain(|(_, g)| g.strong_count() > 0);
        groups.push((std::process::id(), Arc::downgrade(backend)));
    }
    REGISTERING_PID.store(std::process::id(), Ordering::Release);
    on_exit(ExitStage::CloseConnections, close_all);
}

/// Aborts every registered backend of this process that is still alive.
fn close_all() {
    let pid = std::process::id();
    if REGISTERING_PID.load(Ordering::Acquire) != pid {
        return;
    }
    let Some(groups) = lock_within(&GROUPS, PATIENCE) else {
        return;
    };
    let alive: Vec<Arc<CpuBackend>> = groups
        .iter()
        .filter(|(owner, _)| *owner == pid)
        .filter_map(|(_, g)| g.upgrade())
        .collect();
    drop(groups);
    for backend in alive {
        backend.close_connections();
        // Another thread may have dropped its handle meanwhile: this one
        // must not run the group's destructor (joins, unmaps) on the
        // exiting thread.
        std::mem::forget(backend);
    }
}
