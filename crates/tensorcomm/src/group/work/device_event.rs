//! `DeviceEvent`: the device side of a collective's completion.

use crate::Result;

/// The point in a device's queue after which a collective's device work
/// is done: for a CUDA backend, an event recorded on the stream that ran
/// the collective. A device backend hands one to the engine together with
/// a successful host outcome; the engine (`group/`) knows no device types
/// and only calls these three methods.
///
/// [`Work`](super::Work) and [`WorkFuture`](super::WorkFuture) use it for
/// c10d's NCCL semantics: `is_completed` queries it, `wait` makes the
/// caller's current stream wait for it (the host does not block) and
/// `synchronize` blocks the host until it has passed. An error from any
/// method becomes the work's error.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use tensorcomm::group::DeviceEvent;
///
/// /// An event that a test flips by hand.
/// struct Flag(AtomicBool);
///
/// impl DeviceEvent for Flag {
///     fn query(&self) -> tensorcomm::Result<bool> {
///         Ok(self.0.load(Ordering::Acquire))
///     }
///     fn synchronize(&self) -> tensorcomm::Result<()> {
///         while !self.0.load(Ordering::Acquire) {
///             std::thread::yield_now();
///         }
///         Ok(())
///     }
///     fn wait_on_current_stream(&self) -> tensorcomm::Result<()> {
///         Ok(()) // no streams here
///     }
/// }
///
/// let event = Flag(AtomicBool::new(false));
/// assert!(!event.query()?);
/// event.0.store(true, Ordering::Release);
/// event.synchronize()?;
/// assert!(event.query()?);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub trait DeviceEvent: Send + Sync {
    /// True once the device has finished the work before the event; never
    /// blocks.
    fn query(&self) -> Result<bool>;

    /// Blocks the calling thread until the device has finished the work
    /// before the event.
    fn synchronize(&self) -> Result<()>;

    /// Makes work queued later on the calling thread's current stream wait
    /// for the event; returns without waiting for the device.
    fn wait_on_current_stream(&self) -> Result<()>;
}
