//! [`HostRegistration`]: host memory that something else allocated (a
//! shared-memory mapping, say), page-locked and registered with CUDA
//! (`cuMemHostRegister`) so that copies to and from it run on the copy
//! engines asynchronously, as from [`PinnedBuffer`](super::PinnedBuffer).

use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::check_raw;
use super::Context;
use crate::Result;

/// A registered range of host memory, unregistered when dropped, before
/// it lets go of the owner of the memory it holds.
pub(crate) struct HostRegistration {
    ptr: *mut u8,
    len: usize,
    ctx: Arc<Context>,
    /// Keeps the memory mapped for as long as it is registered.
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the value holds an address, not access to what is there; CUDA's
// registration calls may come from any thread.
unsafe impl Send for HostRegistration {}
// SAFETY: as above; `&self` gives only the address.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Registers `ptr .. ptr + len` (page-aligned) with every context
    /// (`CU_MEMHOSTREGISTER_PORTABLE`), through `ctx`.
    ///
    /// # Safety
    ///
    /// The range must be mapped host memory that `owner` keeps mapped for
    /// as long as it lives, and not registered already.
    pub(crate) unsafe fn new(
        ctx: &Arc<Context>,
        ptr: *mut u8,
        len: usize,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Result<HostRegistration> {
        ctx.bind()?;
        // SAFETY: the caller gives a mapped range, kept mapped by `owner`.
        check_raw("cuMemHostRegister", unsafe {
            sys::cuMemHostRegister_v2(ptr.cast::<c_void>(), len, sys::CU_MEMHOSTREGISTER_PORTABLE)
        })?;
        Ok(HostRegistration {
            ptr,
            len,
            ctx: ctx.clone(),
            _owner: owner,
        })
    }

    /// Whether `ptr .. ptr + len` lies inside the registered range.
    pub(crate) fn covers(&self, ptr: *const u8, len: usize) -> bool {
        let (start, end) = (self.ptr as usize, self.ptr as usize + self.len);
        let at = ptr as usize;
        at >= start && at.checked_add(len).is_some_and(|e| e <= end)
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `ptr` was registered by `new` and is unregistered
            // once, while `_owner` still keeps it mapped.
            let _ = unsafe { sys::cuMemHostUnregister(self.ptr.cast::<c_void>()) };
        }
    }
}
