//! Device memory shared between processes (CUDA IPC), and what the driver
//! says about the link between two GPUs.
//!
//! A [`SharedAllocation`] is a dedicated `cuMemAlloc` block (IPC handles
//! cover whole allocations, so it never comes from the buffer cache); its
//! [`IpcHandle`] travels to other processes as 64 bytes, which open it as
//! a [`PeerMapping`]. A process cannot open its own handles: callers that
//! run several ranks in one process use the address directly.

use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::context::{context, Context};
use super::driver::{check, check_raw, ensure_driver};
use super::memory::DevicePtr;
use crate::{Error, Result};

/// The 64 bytes that name a [`SharedAllocation`] to another process.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpcHandle(pub [u8; 64]);

impl std::fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IpcHandle(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

/// A zeroed `cuMemAlloc` block that other processes can map, freed when
/// dropped.
///
/// ```no_run
/// use tensorcomm::cuda::runtime::SharedAllocation;
/// let a = SharedAllocation::zeroed(0, 1 << 20)?;
/// let handle = a.ipc_handle()?; // send these 64 bytes to a peer process
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct SharedAllocation {
    ctx: Arc<Context>,
    ptr: u64,
    len: usize,
}

impl std::fmt::Debug for SharedAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SharedAllocation(cuda:{}, {} bytes)",
            self.ctx.ordinal(),
            self.len
        )
    }
}

impl SharedAllocation {
    /// `len` (at least one) zeroed bytes on GPU `device`.
    pub fn zeroed(device: usize, len: usize) -> Result<SharedAllocation> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "SharedAllocation: expected at least one byte, found 0".into(),
            ));
        }
        let ctx = context(device)?;
        ctx.bind()?;
        // SAFETY: a context is current (bound above).
        let ptr = check("cuMemAlloc", unsafe { result::malloc_sync(len) })?;
        let alloc = SharedAllocation { ctx, ptr, len };
        // Zeroed before anyone sees the handle: on the context's stream,
        // waited for (a memset on the legacy stream is not ordered with
        // work on non-blocking streams, which every other stream here is).
        let stream = alloc.ctx.stream()?;
        super::memory::memset_zero(&alloc.ctx, alloc.ptr(), len, stream)?;
        stream.synchronize()?;
        Ok(alloc)
    }

    /// The start address.
    pub fn ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr)
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: allocations hold at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The GPU holding the block.
    pub fn device(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The handle another process opens with [`PeerMapping::open`].
    pub fn ipc_handle(&self) -> Result<IpcHandle> {
        self.ctx.bind()?;
        handle_of(self.ptr)
    }
}

impl Drop for SharedAllocation {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc and is freed once; whoever
            // queued work on it synchronised before dropping.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// The allocation holding device address `addr` on GPU `device`, named for
/// another process: its IPC handle and `addr`'s offset into it (the
/// handle covers the whole allocation). Fails for memory CUDA IPC cannot
/// share (stream-ordered pools, virtual-memory mappings) or an address no
/// allocation of this process holds.
///
/// ```no_run
/// use tensorcomm::cuda::runtime::{export_address, DeviceBuffer};
/// let b = DeviceBuffer::zeros(0, 4096)?;
/// let (handle, offset) = export_address(0, b.ptr().offset(256))?;
/// assert_eq!(offset % 256, 0);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn export_address(device: usize, addr: DevicePtr) -> Result<(IpcHandle, u64)> {
    let ctx = context(device)?;
    ctx.bind()?;
    let mut base: sys::CUdeviceptr = 0;
    // SAFETY: `base` is a valid out-pointer of the attribute's size; the
    // driver fails cleanly on an address it does not know.
    check_raw("cuPointerGetAttribute(RANGE_START_ADDR)", unsafe {
        sys::cuPointerGetAttribute(
            (&mut base as *mut sys::CUdeviceptr).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            addr.0,
        )
    })?;
    Ok((handle_of(base)?, addr.0 - base))
}

/// The IPC handle of the allocation starting at `base`, in the current
/// context.
fn handle_of(base: sys::CUdeviceptr) -> Result<IpcHandle> {
    let mut raw = sys::CUipcMemHandle_st { reserved: [0; 64] };
    // SAFETY: `raw` is a valid out-pointer; the driver fails cleanly on an
    // address that starts no allocation it can export.
    check_raw("cuIpcGetMemHandle", unsafe {
        sys::cuIpcGetMemHandle(&mut raw, base)
    })?;
    Ok(IpcHandle(raw.reserved.map(|c| c as u8)))
}

/// Another process's [`SharedAllocation`], mapped into this process on one
/// GPU; unmapped when dropped.
pub struct PeerMapping {
    ctx: Arc<Context>,
    ptr: u64,
}

impl std::fmt::Debug for PeerMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PeerMapping(cuda:{})", self.ctx.ordinal())
    }
}

impl PeerMapping {
    /// Maps the allocation named by `handle` (from another process) into
    /// GPU `device`'s address space, with peer access enabled as needed.
    pub fn open(device: usize, handle: &IpcHandle) -> Result<PeerMapping> {
        let ctx = context(device)?;
        ctx.bind()?;
        let raw = sys::CUipcMemHandle_st {
            reserved: handle.0.map(|b| b as _),
        };
        let mut ptr = 0u64;
        // SAFETY: `ptr` is a valid out-pointer; the driver validates the
        // handle and fails cleanly on a stale or foreign one.
        check_raw("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                raw,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        })?;
        Ok(PeerMapping { ctx, ptr })
    }

    /// The mapped address in this process.
    pub fn ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr)
    }
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `ptr` came from cuIpcOpenMemHandle and is closed once;
            // the owner synchronised the work that used it.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}

/// The driver's UUID of GPU `device`: the same in every process, whatever
/// `CUDA_VISIBLE_DEVICES` numbers it.
pub fn device_uuid(device: usize) -> Result<[u8; 16]> {
    let dev = device_handle(device)?;
    let mut uuid = sys::CUuuid_st { bytes: [0; 16] };
    // SAFETY: `uuid` is a valid out-pointer and `dev` a valid device.
    check_raw("cuDeviceGetUuid", unsafe {
        sys::cuDeviceGetUuid_v2(&mut uuid, dev)
    })?;
    Ok(uuid.bytes.map(|c| c as u8))
}

/// The driver's handle of GPU `device`, without creating its context
/// (asking about a GPU must not cost it a context's memory).
fn device_handle(device: usize) -> Result<sys::CUdevice> {
    let count = ensure_driver()?;
    if device >= count {
        return Err(Error::NoCuda {
            reason: format!("no GPU cuda:{device}: this machine has {count} GPUs"),
        });
    }
    let ordinal = i32::try_from(device).map_err(|_| Error::NoCuda {
        reason: format!("no GPU cuda:{device}"),
    })?;
    check("cuDeviceGet", result::device::get(ordinal))
}

/// What the driver reports about kernels on one GPU reaching another's
/// memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerLink {
    /// Kernels can read and write the other GPU's memory.
    pub access: bool,
    /// Atomics on the other GPU's memory are native (NVLink), not emulated
    /// or refused (PCIe).
    pub native_atomics: bool,
    /// The driver's relative rank of the link (lower is faster).
    pub performance_rank: i32,
}

/// The link from GPU `from` to GPU `to`, both visible to this process.
/// A GPU reaches itself with access and native atomics.
///
/// ```no_run
/// let link = tensorcomm::cuda::runtime::peer_link(0, 1)?;
/// println!("cuda:0 -> cuda:1 {link:?}");
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn peer_link(from: usize, to: usize) -> Result<PeerLink> {
    let a = device_handle(from)?;
    if from == to {
        return Ok(PeerLink {
            access: true,
            native_atomics: true,
            performance_rank: 0,
        });
    }
    let b = device_handle(to)?;
    let attribute = |attr: sys::CUdevice_P2PAttribute| -> Result<i32> {
        let mut value = 0;
        // SAFETY: `value` is a valid out-pointer; `a` and `b` are valid
        // devices.
        check_raw("cuDeviceGetP2PAttribute", unsafe {
            sys::cuDeviceGetP2PAttribute(&mut value, attr, a, b)
        })?;
        Ok(value)
    };
    use sys::CUdevice_P2PAttribute as A;
    Ok(PeerLink {
        access: attribute(A::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)? != 0,
        native_atomics: attribute(A::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
        performance_rank: attribute(A::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
    })
}
