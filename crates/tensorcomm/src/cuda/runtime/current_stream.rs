//! The calling thread's current stream on each GPU (PyTorch's
//! `torch.cuda.current_stream`): where work that is "ordered after the
//! caller" is ordered after, and what `Work::wait` makes wait. Unless set,
//! it is the device's legacy default stream (stream 0), as in PyTorch.

use std::cell::RefCell;

use super::context::context;
use super::stream::Stream;
use crate::Result;

thread_local! {
    /// Per device: the stream set by the caller, else the cached default.
    static CURRENT: RefCell<Vec<Option<Stream>>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's current stream on GPU `device`.
///
/// ```no_run
/// use tensorcomm::cuda::runtime::{current_stream, set_current_stream, Stream};
/// let mine = Stream::new(0)?;
/// {
///     let _guard = set_current_stream(&mine);
///     assert!(current_stream(0)?.same_as(&mine));
/// }
/// assert!(!current_stream(0)?.same_as(&mine)); // back to stream 0
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn current_stream(device: usize) -> Result<Stream> {
    if let Some(s) = CURRENT.with(|c| c.borrow().get(device).cloned().flatten()) {
        return Ok(s);
    }
    let ctx = context(device)?;
    let default = Stream::from_cudarc(ctx.cudarc().default_stream());
    CURRENT.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() <= device {
            c.resize(device + 1, None);
        }
        c[device] = Some(default.clone());
    });
    Ok(default)
}

/// Makes `stream` the calling thread's current stream on its device until
/// the returned guard is dropped (which restores the previous one).
pub fn set_current_stream(stream: &Stream) -> CurrentStreamGuard {
    let device = stream.device();
    let previous = CURRENT.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() <= device {
            c.resize(device + 1, None);
        }
        c[device].replace(stream.clone())
    });
    CurrentStreamGuard { device, previous }
}

/// Restores the previous current stream of a device when dropped (see
/// [`set_current_stream`]).
#[must_use = "the stream stays current only while the guard lives"]
pub struct CurrentStreamGuard {
    device: usize,
    previous: Option<Stream>,
}

impl Drop for CurrentStreamGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| {
            if let Some(slot) = c.borrow_mut().get_mut(self.device) {
                *slot = previous;
            }
        });
    }
}
