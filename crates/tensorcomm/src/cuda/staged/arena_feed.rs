//! [`ArenaFeed`]: the copies of a fed all-reduce of a CUDA tensor
//! (`cpu::algorithms::all_reduce_shm_arena_fed`): each step's bytes go
//! from the GPU straight into the rank's buffer in the CPU group's
//! shared-memory arena, registered with CUDA ([`register_arena`]), and the
//! reduced shares straight from the arena back to the GPU, with no pinned
//! copy of the message between. Copies down run on the staging stream,
//! copies back on its second stream (the other direction of the link);
//! each step's are followed by an event the host waits on.

use std::any::Any;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::staged_call::Ordered;
use super::StagingDevice;
use crate::cuda::runtime::{DevicePtr, Event, HostRegistration};
use crate::group::DeviceEvent;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Registers host memory `ptr .. ptr + len` (the arena's mapping, kept
/// mapped by `owner`) through GPU `device`'s context.
///
/// # Safety
///
/// The range must be mapped host memory that `owner` keeps mapped, and
/// not registered already.
pub(crate) unsafe fn register_arena(
    device: &StagingDevice,
    ptr: *mut u8,
    len: usize,
    owner: Arc<dyn Any + Send + Sync>,
) -> Result<HostRegistration> {
    // SAFETY: the caller upholds the contract above.
    unsafe { HostRegistration::new(device.context(), ptr, len, owner) }
}

/// The copies of one fed all-reduce of one contiguous CUDA tensor (see
/// the module docs), by the algorithm's step numbers.
pub(crate) struct ArenaFeed<'a> {
    device: &'a StagingDevice,
    registered: &'a HostRegistration,
    base: DevicePtr,
    len: usize,
    /// Each step's point after its copies down, until waited for.
    fills: Vec<Option<Event>>,
    /// Each step's point after its copies back, until seen done.
    drains: Vec<Option<Event>>,
}

impl<'a> ArenaFeed<'a> {
    /// Copies of contiguous CUDA tensor `tensor` (on `device`'s GPU) to
    /// and from `registered` memory.
    pub(crate) fn new(
        device: &'a StagingDevice,
        registered: &'a HostRegistration,
        tensor: &Tensor<'static>,
    ) -> Result<ArenaFeed<'a>> {
        if !tensor.is_contiguous()
            || tensor.device() != crate::tensor::Device::Cuda(device.ordinal())
        {
            return Err(Error::InvalidArgument(format!(
                "a fed all_reduce expected a contiguous tensor on cuda:{}, found {} on {}",
                device.ordinal(),
                if tensor.is_contiguous() {
                    "a contiguous tensor"
                } else {
                    "a strided tensor"
                },
                tensor.device()
            )));
        }
        let (_, base) = tensor.cuda_ptr()?;
        Ok(ArenaFeed {
            device,
            registered,
            base,
            len: tensor.nbytes(),
            fills: Vec::new(),
            drains: Vec::new(),
        })
    }

    /// Checks that bytes `message` of the tensor and `len` bytes at
    /// `host` lie where the copies may go.
    fn check(&self, message: &Range<usize>, host: *const u8) -> Result<()> {
        if message.start <= message.end
            && message.end <= self.len
            && self.registered.covers(host, message.len())
        {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "a fed all_reduce asked to copy bytes {message:?} of a {}-byte tensor to or from host memory outside the registered arena",
            self.len
        )))
    }

    /// Starts copying bytes `from` of the tensor to `to`, as step `step`.
    ///
    /// # Safety
    ///
    /// Nobody reads or writes `to .. to + from.len()` until
    /// [`filled`](Self::filled) for `step` says the copy landed, and the
    /// tensor stays allocated until then.
    pub(crate) unsafe fn fill(
        &mut self,
        step: usize,
        from: Range<usize>,
        to: *mut u8,
    ) -> Result<()> {
        self.check(&from, to)?;
        let src = self.base.offset(from.start);
        // SAFETY: `check` put both ends in bounds (`to` registered); the
        // caller keeps them untouched and allocated until the copy ran.
        unsafe { self.device.copy_down_raw(src, to, from.len())? };
        let done = self.device.mark(false)?;
        put(&mut self.fills, step, done);
        Ok(())
    }

    /// Whether step `step`'s copies down have landed; with `block`, waits
    /// until they have.
    pub(crate) fn filled(&mut self, step: usize, block: bool, deadline: Instant) -> Result<bool> {
        let doing = "copying a CUDA tensor into shared memory";
        passed(&mut self.fills, step, block, deadline, doing)
    }

    /// Starts copying each `(from, to)`: `to.len()` bytes at `from` into
    /// bytes `to` of the tensor, as step `step`.
    ///
    /// # Safety
    ///
    /// Nobody writes any `from .. from + to.len()`, and nothing else uses
    /// those bytes of the tensor, until [`drained`](Self::drained) for
    /// `step` says so; the tensor stays allocated until then.
    pub(crate) unsafe fn drain(
        &mut self,
        step: usize,
        pieces: &[(*const u8, Range<usize>)],
    ) -> Result<()> {
        for (from, to) in pieces {
            self.check(to, *from)?;
        }
        for (from, to) in pieces {
            let dst = self.base.offset(to.start);
            // SAFETY: `check` put both ends in bounds (`from` registered);
            // the caller keeps them as they are until the copy ran.
            unsafe { self.device.copy_up_raw_beside(*from, dst, to.len())? };
        }
        let done = self.device.mark(true)?;
        put(&mut self.drains, step, done);
        Ok(())
    }

    /// Whether step `step`'s copies back are done; with `block`, waits
    /// until they are.
    pub(crate) fn drained(&mut self, step: usize, block: bool, deadline: Instant) -> Result<bool> {
        let doing = "copying from shared memory into a CUDA tensor";
        passed(&mut self.drains, step, block, deadline, doing)
    }
}

/// Whether the point after step `step`'s copies among `events` has
/// passed (forgetting it once it has); with `block`, waits for it.
fn passed(
    events: &mut [Option<Event>],
    step: usize,
    block: bool,
    deadline: Instant,
    doing: &str,
) -> Result<bool> {
    let Some(slot) = events.get_mut(step) else {
        return Err(Error::InvalidArgument(format!(
            "a fed all_reduce asked after step {step}'s copies ({doing}), which were never queued"
        )));
    };
    let Some(done) = slot else {
        return Ok(true);
    };
    if block {
        wait_event(done, deadline, doing)?;
    } else if !done.query()? {
        return Ok(false);
    }
    *slot = None;
    Ok(true)
}

fn put(events: &mut Vec<Option<Event>>, step: usize, event: Event) {
    if events.len() <= step {
        events.resize_with(step + 1, || None);
    }
    events[step] = Some(event);
}

/// Waits for `event`: spinning a little (a step's copies take tens of
/// microseconds), then yielding, then in short sleeps; fails at
/// `deadline`, saying it was `doing`.
fn wait_event(event: &Event, deadline: Instant, doing: &str) -> Result<()> {
    let started = Instant::now();
    while !event.query()? {
        let waited = started.elapsed();
        if Instant::now() >= deadline {
            return Err(Error::Cuda {
                call: doing.into(),
                code: "timeout".into(),
                message: format!(
                    "the copies had not run after {waited:?}: they wait for the work queued before the call on the caller's current stream, which had not finished"
                ),
            });
        }
        if waited < Duration::from_micros(50) {
            std::hint::spin_loop();
        } else if waited < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    Ok(())
}

impl Ordered {
    /// A fed all_reduce of contiguous CUDA tensor `tensor`: `run` runs
    /// the algorithm with an [`ArenaFeed`] over `registered`, in call
    /// order after the caller's stream. The event completes once every
    /// copy back is done (the algorithm waits for them itself).
    pub(crate) fn fed_all_reduce(
        self,
        tensor: &Tensor<'static>,
        registered: &HostRegistration,
        run: &mut dyn FnMut(&mut ArenaFeed<'_>) -> Result<()>,
    ) -> Result<Arc<dyn DeviceEvent>> {
        let device = self.into_device()?;
        let ran = ArenaFeed::new(&device, registered, tensor).and_then(|mut feed| run(&mut feed));
        if let Err(e) = ran {
            // Copies may still run into or out of the arena and the tensor.
            device.settle();
            return Err(e);
        }
        device.join_up()?;
        let done: Arc<dyn DeviceEvent> = device.record(vec![tensor.clone()])?;
        Ok(done)
    }
}
