//! One NCCL communicator: created non-blocking from a unique id that rank 0
//! posts to the store (so joining needs nothing but the store), ready or
//! aborted within the group's timeout, split for sub-groups, aborted on
//! failure and finalized when dropped.
//!
//! With blocking launches (`TENSORCOMM_NCCL_LAUNCH=blocking`) it is split
//! once more into a blocking communicator for the collectives:
//! NCCL queues every call on a non-blocking communicator from a thread it
//! starts for that call (70-130 µs a call on two H100s), a blocking one on
//! the caller's thread. A blocking call must not wait on the host for a
//! peer, where neither the group's timeout nor its abort reaches it, so:
//! NCCL must make every collective's connections while the communicators
//! are created, within the timeout (`NCCL_RUNTIME_CONNECT=0`, which the
//! user sets on every rank; without it rank 0 falls back to non-blocking
//! launches, with a warning); point-to-point calls, whose connections NCCL makes at the
//! first transfer with each peer, go through the non-blocking
//! communicator (the blocking one's root); and sub-groups are split from
//! the root, with the timeout, then split again into blocking ones.
//!
//! Not the default yet: on two H200s, with ranks as threads of one
//! process, the whole group's first all_reduce after a sub-group was
//! dropped hung on one rank and gave the other a wrong sum, with blocking
//! launches and eager connections only (it passed non-blocking, and
//! blocking with NCCL's first-use connections); not diagnosed, and not yet
//! tried with ranks as processes.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, TryLockError};
use std::time::{Duration, Instant};

use super::aborts_in_flight::{wait_for_aborts_at_exit_once, ABORTS};
use super::library::{nccl, Config, Nccl, RawComm, UniqueId, IN_PROGRESS, SUCCESS};
use std::sync::Arc;

use crate::cuda::runtime::{self, Context};
use crate::env_vars;
use crate::group::backend::{ABORTED, NOT_QUEUED};
use crate::store::Store;
use crate::{Error, Result};

/// Bytes rank 0 posts: the unique id, then 1 if the group's collectives
/// run on a blocking communicator.
const POSTED_LEN: usize = 129;

/// The out-parameter and the config of one `ncclCommSplit`.
/// NCCL stores the new communicator into `raw` from its own thread (an
/// atomic store), so it is read atomically here.
struct SplitSlots {
    raw: AtomicPtr<c_void>,
    config: Config,
}

/// `TENSORCOMM_NCCL_LAUNCH`: true for `blocking`; `nonblocking` is the
/// default (see the module docs).
fn blocking_launch() -> Result<bool> {
    match env_vars::NCCL_LAUNCH.get().as_deref().map(str::trim) {
        Some("blocking") => Ok(true),
        None | Some("") | Some("nonblocking") => Ok(false),
        Some(other) => Err(Error::BadValue {
            name: env_vars::NCCL_LAUNCH.name.into(),
            expected: "blocking or nonblocking".into(),
            found: other.into(),
        }),
    }
}

/// NCCL's variable for when it connects ranks: at first use (1, NCCL's
/// default) or while the communicator is created (0).
const RUNTIME_CONNECT: &str = "NCCL_RUNTIME_CONNECT";

/// True if NCCL connects every collective's peers while a communicator is
/// created (`NCCL_RUNTIME_CONNECT=0`), which blocking launches need (see
/// the module docs). Read, never set: NCCL reads it once per process, and
/// setting the environment of a running process is not safe.
fn connects_eagerly() -> bool {
    std::env::var(RUNTIME_CONNECT).is_ok_and(|v| v.trim() == "0")
}

/// How long a non-blocking communicator's state is polled without
/// sleeping, then how long to sleep between polls.
const SPIN: Duration = Duration::from_millis(2);
const POLL: Duration = Duration::from_micros(200);
/// How long a dropped communicator may take to finish its work before it
/// is aborted instead.
const FINALIZE_WITHIN: Duration = Duration::from_secs(10);

/// An NCCL communicator on one GPU (see the module docs).
///
/// Every use of the raw communicator holds a read guard of `gate` and the
/// `calls` lock ([`Communicator::enter`]), and [`Communicator::abort`]
/// takes `gate` for writing, so no thread uses it while or after NCCL
/// frees it, and NCCL gets one call at a time on it: it is not safe for
/// concurrent calls on one communicator (the watchdog's
/// `ncclCommGetAsyncError` during another thread's collective crashed
/// NCCL, one rank in several runs at 4 ranks).
pub(crate) struct Communicator {
    raw: RawComm,
    gate: RwLock<()>,
    calls: Mutex<()>,
    /// The GPU's context, made current for every use.
    ctx: Arc<Context>,
    pub(crate) nccl: &'static Nccl,
    pub(crate) device: usize,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// True if calls on it block until queued (no `ncclInProgress`).
    blocking: bool,
    aborted: AtomicBool,
    /// For a blocking communicator, the non-blocking one it was split from:
    /// point-to-point calls and sub-group splits go through it (see the
    /// module docs). Dropped (finalized) after this one.
    root: Option<Box<Communicator>>,
}

// SAFETY: an NCCL communicator may be used from any thread; tensorcomm
// serializes the calls that queue work on it (the backend's launch lock)
// and keeps every use out of the way of its abort (`gate`).
unsafe impl Send for Communicator {}
unsafe impl Sync for Communicator {}

impl Communicator {
    /// Creates rank `rank` of `size` on GPU `device`, meeting the others
    /// under `key` in `store`; fails with [`Error::NcclInitTimeout`] when
    /// not every rank joins within `timeout`. Every rank follows rank 0's
    /// `TENSORCOMM_NCCL_LAUNCH`.
    pub(crate) fn init(
        store: &dyn Store,
        key: &str,
        (rank, size): (usize, usize),
        device: usize,
        timeout: Duration,
    ) -> Result<Communicator> {
        let nccl = nccl()?;
        let started = Instant::now();
        let ctx = runtime::context(device)?;
        ctx.bind()?;
        let id_key = format!("{key}/unique_id");
        let (id, blocking) = if rank == 0 {
            let mut blocking = blocking_launch()?;
            if blocking && !connects_eagerly() {
                tracing::warn!(
                    "{}=blocking needs {RUNTIME_CONNECT}=0 on every rank (a blocking call must not wait for a first connection); launching non-blocking",
                    env_vars::NCCL_LAUNCH.name
                );
                blocking = false;
            }
            let mut id = UniqueId { bytes: [0; 128] };
            // SAFETY: one ncclUniqueId out-parameter.
            nccl.check(
                "ncclGetUniqueId",
                unsafe { (nccl.get_unique_id)(&mut id) },
                None,
            )?;
            let mut posted = id.bytes.to_vec();
            posted.push(u8::from(blocking));
            store.set(&id_key, &posted)?;
            (id, blocking)
        } else {
            let posted = store.get_timeout(&id_key, timeout)?;
            let (bytes, blocking) = match posted.as_slice() {
                [id @ .., mode @ (0 | 1)] if posted.len() == POSTED_LEN => (id, *mode == 1),
                _ => {
                    return Err(Error::PeerProtocol {
                        peer: 0,
                        expected: format!(
                            "a 128-byte NCCL unique id and a launch mode (0 or 1) under {id_key}"
                        ),
                        found: format!("{} bytes", posted.len()),
                    })
                }
            };
            let mut id = UniqueId { bytes: [0; 128] };
            id.bytes.copy_from_slice(bytes);
            if blocking && !connects_eagerly() {
                return Err(Error::BadValue {
                    name: RUNTIME_CONNECT.into(),
                    expected: format!(
                        "0, as on rank 0, which chose {}=blocking",
                        env_vars::NCCL_LAUNCH.name
                    ),
                    found: std::env::var(RUNTIME_CONNECT).unwrap_or_else(|_| "unset".into()),
                });
            }
            (id, blocking)
        };
        let joined_key = format!("{key}/joined");
        store.add(&joined_key, 1)?;
        let mut config = Config::new(false);
        let mut raw: RawComm = std::ptr::null_mut();
        let code = unsafe {
            // SAFETY: out-parameter, the id by value, a valid config; the
            // device's context is current.
            (nccl.comm_init_rank_config)(&mut raw, size as i32, id, rank as i32, &mut config)
        };
        if code != SUCCESS && code != IN_PROGRESS {
            if !raw.is_null() {
                // SAFETY: a communicator NCCL handed out.
                unsafe { (nccl.comm_abort)(raw) };
            }
            return Err(nccl.error("ncclCommInitRankConfig", code, None));
        }
        let comm = Communicator {
            raw,
            gate: RwLock::new(()),
            calls: Mutex::new(()),
            ctx,
            nccl,
            device,
            rank,
            size,
            blocking: false,
            aborted: AtomicBool::new(false),
            root: None,
        };
        let remaining = timeout.saturating_sub(started.elapsed());
        match comm.wait_ready("ncclCommInitRankConfig", remaining) {
            Ok(()) if blocking => {
                // The library's exit hooks (a store lingering for its
                // clients) run before NCCL's clean-up.
                static SITE: std::sync::Once = std::sync::Once::new();
                crate::process_exit::run_before_handlers_registered_so_far(&SITE);
                // Every rank is in, so the split does not wait for a rank
                // that never came.
                comm.into_blocking(timeout.saturating_sub(started.elapsed()))
            }
            Ok(()) => {
                // Once NCCL has set itself up (handlers registered later
                // run earlier at exit).
                wait_for_aborts_at_exit_once();
                // And before that wait, the library's exit hooks (a store
                // lingering for its clients, while NCCL still works), also
                // when a blocking communicator registered them earlier.
                static SITE: std::sync::Once = std::sync::Once::new();
                crate::process_exit::run_before_handlers_registered_so_far(&SITE);
                Ok(comm)
            }
            Err(None) => {
                comm.abort();
                // Read only if there (a get would wait the store's timeout).
                let joined = crate::store::read_if_present(store, &joined_key)
                    .ok()
                    .flatten()
                    .and_then(|v| String::from_utf8(v).ok())
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                Err(Error::NcclInitTimeout {
                    rank,
                    size,
                    device,
                    timeout,
                    joined,
                })
            }
            Err(Some(e)) => {
                comm.abort();
                Err(e)
            }
        }
    }

    /// Splits off the communicator of the ranks that pass the same `color`
    /// (ordered by `key`); `None` on a rank that passes no color.
    /// Every rank of this communicator calls it. A split that fails or
    /// does not end within `timeout` aborts this communicator too (with
    /// blocking launches: when splitting the root fails; when the second
    /// split, into the sub-group's blocking communicator, fails, only the
    /// sub-group's root is aborted).
    pub(crate) fn split(
        &self,
        color: Option<usize>,
        key: usize,
        timeout: Duration,
    ) -> Result<Option<Communicator>> {
        let Some(root) = &self.root else {
            return self.split_into(color, key, timeout, self.blocking);
        };
        let started = Instant::now();
        let sub_root = match root.split_into(color, key, timeout, false) {
            Ok(Some(sub_root)) => sub_root,
            Ok(None) => return Ok(None),
            Err(e) => {
                // The root is aborted: so is the group's communicator.
                self.abort();
                return Err(e);
            }
        };
        sub_root
            .into_blocking(timeout.saturating_sub(started.elapsed()))
            .map(Some)
    }

    /// Splits this non-blocking communicator (every rank of it calls this)
    /// into a blocking one with the same ranks, whose root it becomes.
    /// On failure this communicator is aborted (not left to finalize).
    fn into_blocking(self, timeout: Duration) -> Result<Communicator> {
        let split = self.split_into(Some(0), self.rank, timeout, true);
        let mut child = match split {
            Ok(Some(child)) => child,
            Ok(None) => {
                self.abort();
                return Err(Error::Nccl {
                    call: "ncclCommSplit".into(),
                    code: "no communicator".into(),
                    message: "a split with one color for every rank gave this rank none".into(),
                });
            }
            Err(e) => {
                self.abort();
                return Err(e);
            }
        };
        child.root = Some(Box::new(self));
        Ok(child)
    }

    /// The communicator for point-to-point calls: the root of a blocking
    /// one (see the module docs), else this one.
    pub(crate) fn p2p(&self) -> &Communicator {
        self.root.as_deref().unwrap_or(self)
    }

    /// The error of a split that did not end within `timeout`.
    fn split_timed_out(&self, timeout: Duration) -> Error {
        Error::NcclInitTimeout {
            rank: self.rank,
            size: self.size,
            device: self.device,
            timeout,
            joined: 0,
        }
    }

    /// Waits until a split's job has stored the new communicator into
    /// `slot`, until `deadline`, watching the parent for an error
    /// meanwhile. `Err(None)` when the deadline passed.
    fn wait_for_child(
        &self,
        slot: &AtomicPtr<c_void>,
        deadline: Instant,
    ) -> std::result::Result<(), Option<Error>> {
        loop {
            if !slot.load(Ordering::Acquire).is_null() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(None);
            }
            let state = {
                let c = self.enter().map_err(Some)?;
                (self.state(c.raw()), c.raw())
            };
            match state {
                (SUCCESS | IN_PROGRESS, _) => std::thread::sleep(POLL),
                (code, raw) => return Err(Some(self.nccl.error("ncclCommSplit", code, Some(raw)))),
            }
        }
    }

    /// [`Communicator::split`], the child blocking or not.
    fn split_into(
        &self,
        color: Option<usize>,
        key: usize,
        timeout: Duration,
        blocking: bool,
    ) -> Result<Option<Communicator>> {
        /// `NCCL_SPLIT_NOCOLOR`.
        const NO_COLOR: i32 = -1;
        // NCCL finishes a split on a thread of its own and writes the new
        // communicator through `raw` when that job ends, which may be
        // after this function has stopped waiting: the out-parameter lives
        // on the heap, and is reclaimed only once no job can write to it
        // (the job returned, or the parent's abort joined it).
        let color_code = color.map_or(NO_COLOR, |c| c as i32);
        let parent = self.enter()?;
        let started = Instant::now();
        let slots = Box::into_raw(Box::new(SplitSlots {
            raw: AtomicPtr::new(std::ptr::null_mut()),
            config: Config::new(blocking),
        }));
        // SAFETY: a live communicator; `slots` stays valid while NCCL may
        // write to it (freed below only once no job can).
        let code = unsafe {
            (self.nccl.comm_split)(
                parent.raw(),
                color_code,
                key as i32,
                (*slots).raw.as_ptr(),
                &raw mut (*slots).config,
            )
        };
        drop(parent);
        // The parent finishes the split for every rank. On a non-blocking
        // parent the job may still run whether NCCL returned in progress or
        // success (the parent then reports in progress): every rank waits
        // for the parent, which joins the job, so that no rank frees
        // `slots` or uses the parent before the job is done. A blocking
        // parent's split is over when the call returns.
        let job_may_run = code == IN_PROGRESS || (code == SUCCESS && !self.blocking);
        let waited = if job_may_run || code == SUCCESS {
            // SAFETY: `slots` is live until reclaimed below.
            let slot = unsafe { &(*slots).raw };
            let waited = if job_may_run {
                self.wait_ready("ncclCommSplit", timeout)
            } else {
                Ok(())
            };
            // Then a member checks that its communicator arrived (NCCL
            // stores it as the job ends), within the same timeout.
            let waited = waited.and_then(|()| match color {
                Some(_) => self.wait_for_child(slot, started + timeout),
                None => Ok(()),
            });
            if waited.is_err() {
                // Stop the job (aborting the parent joins it): the split
                // failed or did not end in time, so the parent is broken
                // or stuck in it anyway.
                self.abort();
            }
            waited
        } else {
            self.nccl
                .check("ncclCommSplit", code, Some(self.raw))
                .map_err(Some)
        };
        // SAFETY: no job writes to `slots` any more (see above); allocated
        // above, freed once.
        let raw = unsafe { Box::from_raw(slots) }.raw.into_inner();
        if let Err(e) = waited {
            if !raw.is_null() {
                // SAFETY: a communicator NCCL handed out and nobody uses.
                unsafe { (self.nccl.comm_abort)(raw) };
            }
            return Err(e.unwrap_or_else(|| self.split_timed_out(timeout)));
        }
        if raw.is_null() {
            return Ok(None);
        }
        let nccl = self.nccl;
        let mut size = 0;
        let mut rank = 0;
        let mut child = Communicator {
            raw,
            gate: RwLock::new(()),
            calls: Mutex::new(()),
            ctx: self.ctx.clone(),
            nccl,
            device: self.device,
            rank: 0,
            size: 0,
            blocking,
            aborted: AtomicBool::new(false),
            root: None,
        };
        if let Err(e) = child.wait_ready("ncclCommSplit", timeout.saturating_sub(started.elapsed()))
        {
            child.abort();
            return Err(e.unwrap_or_else(|| self.split_timed_out(timeout)));
        }
        // SAFETY: out-parameters of a ready communicator.
        unsafe {
            nccl.check(
                "ncclCommCount",
                (nccl.comm_count)(raw, &mut size),
                Some(raw),
            )?;
            nccl.check(
                "ncclCommUserRank",
                (nccl.comm_user_rank)(raw, &mut rank),
                Some(raw),
            )?;
        }
        child.rank = rank as usize;
        child.size = size as usize;
        Ok(Some(child))
    }

    /// Waits until the communicator is no longer in progress: `Err(None)`
    /// when `timeout` passes first, `Err(Some(e))` when NCCL reports an
    /// error.
    fn wait_ready(&self, call: &str, timeout: Duration) -> std::result::Result<(), Option<Error>> {
        let started = Instant::now();
        let deadline = started + timeout;
        loop {
            let state = {
                let c = self.enter().map_err(Some)?;
                (self.state(c.raw()), c.raw())
            };
            match state {
                (SUCCESS, _) => return Ok(()),
                (IN_PROGRESS, _) if Instant::now() < deadline => {
                    // Queuing work usually finishes within microseconds;
                    // creating a communicator takes milliseconds.
                    if started.elapsed() < SPIN {
                        std::hint::spin_loop();
                    } else {
                        std::thread::sleep(POLL);
                    }
                }
                (IN_PROGRESS, _) => return Err(None),
                (code, raw) => return Err(Some(self.nccl.error(call, code, Some(raw)))),
            }
        }
    }

    /// Waits until a call that returned `ncclInProgress` has queued its
    /// work (NCCL may be connecting ranks), until `deadline`.
    pub(crate) fn wait_queued(&self, call: &str, deadline: Instant) -> Result<()> {
        let within = deadline.saturating_duration_since(Instant::now());
        match self.wait_ready(call, within) {
            Ok(()) => Ok(()),
            Err(Some(e)) => Err(e),
            Err(None) => Err(Error::Nccl {
                call: call.into(),
                code: NOT_QUEUED.into(),
                message: format!("still in progress after {within:?}"),
            }),
        }
    }

    /// `ncclCommGetAsyncError` of `raw` (entered): `ncclSuccess`,
    /// `ncclInProgress` or the error that broke the communicator.
    fn state(&self, raw: RawComm) -> i32 {
        let mut state = SUCCESS;
        // SAFETY: a communicator NCCL handed out, kept alive by the caller's
        // guard.
        let code = unsafe { (self.nccl.comm_get_async_error)(raw, &mut state) };
        if code != SUCCESS {
            return code;
        }
        state
    }

    /// The GPU's context.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The communicator, for one use: refused once it is aborted; the
    /// device's context is made current on the calling thread. Other
    /// threads' uses wait until this one is dropped (hold it only around
    /// NCCL calls, never while waiting for NCCL).
    pub(crate) fn enter(&self) -> Result<Entered<'_>> {
        let guard = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        self.refuse_if_aborted()?;
        let call = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        self.ctx.bind()?;
        Ok(Entered {
            raw: self.raw,
            _call: call,
            _guard: guard,
        })
    }

    /// [`enter`](Communicator::enter) unless another thread is using the
    /// communicator (`None` then): for checks that must not wait behind a
    /// call that may block (the watchdog's).
    fn try_enter(&self) -> Result<Option<Entered<'_>>> {
        let guard = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        self.refuse_if_aborted()?;
        let call = match self.calls.try_lock() {
            Ok(call) => call,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Ok(None),
        };
        self.ctx.bind()?;
        Ok(Some(Entered {
            raw: self.raw,
            _call: call,
            _guard: guard,
        }))
    }

    /// The error of using an aborted communicator, if this one is.
    pub(crate) fn refuse_if_aborted(&self) -> Result<()> {
        if self.is_aborted() {
            return Err(Error::Nccl {
                call: "the NCCL communicator".into(),
                code: ABORTED.into(),
                message: "it was aborted after an earlier failure of its group".into(),
            });
        }
        Ok(())
    }

    /// The communicator's asynchronous error, if it has one; an aborted
    /// communicator's is that it was aborted. A communicator another
    /// thread is using is not asked (the next check will), so the
    /// watchdog never waits behind a call that blocks.
    pub(crate) fn health(&self) -> Result<()> {
        if let Some(c) = self.try_enter()? {
            match self.state(c.raw()) {
                SUCCESS | IN_PROGRESS => {}
                code => {
                    return Err(self
                        .nccl
                        .error("ncclCommGetAsyncError", code, Some(c.raw())))
                }
            }
        }
        match &self.root {
            Some(root) => root.health(),
            None => Ok(()),
        }
    }

    /// Aborts the communicator: its queued work ends without finishing,
    /// and it takes no more. Waits for uses in progress; only the first
    /// call does anything.
    pub(crate) fn abort(&self) {
        // The process's exit waits for this (see `aborts_in_flight`); once
        // it is exiting, NCCL is not called any more.
        let Some(_aborting) = ABORTS.begin() else {
            self.aborted.store(true, Ordering::Release);
            return;
        };
        {
            let _exclusive = self.gate.write().unwrap_or_else(PoisonError::into_inner);
            if !self.aborted.swap(true, Ordering::AcqRel) {
                let _ = self.ctx.bind();
                // SAFETY: a communicator NCCL handed out, used by no other
                // thread now; aborted once.
                unsafe { (self.nccl.comm_abort)(self.raw) };
            }
        }
        if let Some(root) = &self.root {
            root.abort();
        }
    }

    /// True once [`Communicator::abort`] has run.
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }
}

/// A use of a communicator (see [`Communicator::enter`]).
pub(crate) struct Entered<'a> {
    raw: RawComm,
    _call: MutexGuard<'a, ()>,
    _guard: RwLockReadGuard<'a, ()>,
}

impl Entered<'_> {
    /// The raw communicator, valid while this lives.
    pub(crate) fn raw(&self) -> RawComm {
        self.raw
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if self.is_aborted() || self.raw.is_null() {
            return;
        }
        let _ = self.ctx.bind();
        // SAFETY: a live communicator no other thread uses (it is being
        // dropped); finalized, then destroyed once.
        let code = unsafe { (self.nccl.comm_finalize)(self.raw) };
        let ready = (code == SUCCESS || code == IN_PROGRESS)
            && self.wait_ready("ncclCommFinalize", FINALIZE_WITHIN).is_ok();
        if ready {
            // SAFETY: finalized above.
            unsafe { (self.nccl.comm_destroy)(self.raw) };
        } else {
            self.abort();
        }
    }
}
