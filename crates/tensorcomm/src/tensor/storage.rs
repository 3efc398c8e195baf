//! The memory behind tensors, shared by every view of it.
//!
//! A [`Storage`] is a flat run of bytes on one device. Host storage either
//! owns a type-erased `Vec<T>` (so [`Tensor::into_vec`](super::Tensor::into_vec)
//! can hand the very same allocation back) or borrows the caller's
//! `&'a mut [T]` as bytes. Both are reached through `bytemuck`, so no
//! `unsafe` is needed here. With the `cuda` feature, [`Memory`] also holds
//! pinned host buffers and GPU memory, whose bytes only `cuda::runtime`
//! touches.
//!
//! Views share one storage through [`SharedStorage`] (`Arc<RwLock<..>>`):
//! many readers at once, one writer at a time.

use std::any::Any;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{DType, Device};
use crate::Result;

/// The error for host-only access to GPU memory.
#[cfg(feature = "cuda")]
fn not_host(ordinal: usize) -> crate::Error {
    crate::Error::InvalidArgument(format!(
        "expected a tensor in host memory, found one on cuda:{ordinal} \
         (copy it with to_device(Device::Cpu) first)"
    ))
}

/// Host memory a storage owns: a `Vec<T>` of plain-old-data elements seen
/// as bytes, or memory another layer manages (such as a group's symmetric
/// shared memory), whose owner implements this trait.
pub(crate) trait HostBuffer: Send + Sync {
    /// The elements as bytes.
    ///
    /// Implementations outside this module must return the same bytes on
    /// every call (views keep byte offsets into them).
    fn bytes(&self) -> &[u8];
    /// The elements as writable bytes.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// The buffer as `Any`, so the original `Vec<T>` can be recovered.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
    /// What the buffer is, for error messages: `Vec<f32>`.
    fn holds(&self) -> String;
}

impl<T: bytemuck::Pod + Send + Sync> HostBuffer for Vec<T> {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(self.as_slice())
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(self.as_mut_slice())
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }

    fn holds(&self) -> String {
        format!("Vec<{}>", std::any::type_name::<T>())
    }
}

/// Where a storage's bytes are.
pub(crate) enum Memory<'a> {
    /// Host memory owned by the storage.
    HostOwned(Box<dyn HostBuffer>),
    /// Host memory borrowed from the caller for `'a`.
    HostBorrowed(&'a mut [u8]),
    /// Page-locked host memory (fast, asynchronous copies to GPUs).
    #[cfg(feature = "cuda")]
    Pinned(crate::cuda::runtime::PinnedBuffer),
    /// Memory on a GPU; its bytes are reached through `cuda::runtime`.
    #[cfg(feature = "cuda")]
    Cuda(super::cuda::CudaMemory<'a>),
}

/// A flat run of bytes on one device, shared by the tensors viewing it.
pub(crate) struct Storage<'a> {
    memory: Memory<'a>,
}

/// The handle every view holds.
pub(crate) type SharedStorage<'a> = Arc<RwLock<Storage<'a>>>;

impl<'a> Storage<'a> {
    /// Storage owning `data` (no copy).
    pub(crate) fn from_vec<T: bytemuck::Pod + Send + Sync>(data: Vec<T>) -> Self {
        Storage {
            memory: Memory::HostOwned(Box::new(data)),
        }
    }

    /// Storage owning `buffer` (no copy).
    pub(crate) fn from_host_buffer(buffer: Box<dyn HostBuffer>) -> Self {
        Storage {
            memory: Memory::HostOwned(buffer),
        }
    }

    /// Storage viewing the caller's bytes for `'a` (no copy).
    pub(crate) fn borrowed(bytes: &'a mut [u8]) -> Self {
        Storage {
            memory: Memory::HostBorrowed(bytes),
        }
    }

    /// Zero-filled host storage of `len` elements of `dtype`, allocated as a
    /// `Vec` of the dtype's Rust type (so `into_vec` can return it).
    pub(crate) fn zeros(dtype: DType, len: usize) -> Self {
        super::element::dispatch_dtype!(dtype, T => {
            Storage::from_vec(vec![<T as bytemuck::Zeroable>::zeroed(); len])
        })
    }

    /// Wraps the storage for sharing between views.
    pub(crate) fn shared(self) -> SharedStorage<'a> {
        Arc::new(RwLock::new(self))
    }

    /// Storage over `memory`.
    #[cfg(feature = "cuda")]
    pub(crate) fn from_memory(memory: Memory<'a>) -> Self {
        Storage { memory }
    }

    /// The device holding the bytes.
    pub(crate) fn device(&self) -> Device {
        match &self.memory {
            Memory::HostOwned(_) | Memory::HostBorrowed(_) => Device::Cpu,
            #[cfg(feature = "cuda")]
            Memory::Pinned(_) => Device::Cpu,
            #[cfg(feature = "cuda")]
            Memory::Cuda(m) => Device::Cuda(m.device()),
        }
    }

    /// Size in bytes.
    pub(crate) fn nbytes(&self) -> usize {
        match &self.memory {
            Memory::HostOwned(buffer) => buffer.bytes().len(),
            Memory::HostBorrowed(bytes) => bytes.len(),
            #[cfg(feature = "cuda")]
            Memory::Pinned(p) => p.len(),
            #[cfg(feature = "cuda")]
            Memory::Cuda(m) => m.len(),
        }
    }

    /// The bytes of host storage; an error for GPU storage.
    pub(crate) fn bytes(&self) -> Result<&[u8]> {
        match &self.memory {
            Memory::HostOwned(buffer) => Ok(buffer.bytes()),
            Memory::HostBorrowed(bytes) => Ok(bytes),
            #[cfg(feature = "cuda")]
            Memory::Pinned(p) => Ok(p.as_slice()),
            #[cfg(feature = "cuda")]
            Memory::Cuda(m) => Err(not_host(m.device())),
        }
    }

    /// The writable bytes of host storage; an error for GPU storage.
    pub(crate) fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        match &mut self.memory {
            Memory::HostOwned(buffer) => Ok(buffer.bytes_mut()),
            Memory::HostBorrowed(bytes) => Ok(bytes),
            #[cfg(feature = "cuda")]
            Memory::Pinned(p) => Ok(p.as_mut_slice()),
            #[cfg(feature = "cuda")]
            Memory::Cuda(m) => Err(not_host(m.device())),
        }
    }

    /// The GPU memory behind CUDA storage.
    #[cfg(feature = "cuda")]
    pub(crate) fn cuda(&self) -> Option<&super::cuda::CudaMemory<'a>> {
        match &self.memory {
            Memory::Cuda(m) => Some(m),
            _ => None,
        }
    }

    /// The storage's memory, for taking an owned buffer back.
    pub(crate) fn into_memory(self) -> Memory<'a> {
        self.memory
    }
}

/// Read access to shared storage. A poisoned lock is still usable: the
/// storage is plain bytes with no invariant a panic could break.
pub(crate) fn read<'s, 'a>(storage: &'s SharedStorage<'a>) -> RwLockReadGuard<'s, Storage<'a>> {
    storage.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write access to shared storage (see [`read`] about poisoning).
pub(crate) fn write<'s, 'a>(storage: &'s SharedStorage<'a>) -> RwLockWriteGuard<'s, Storage<'a>> {
    storage.write().unwrap_or_else(PoisonError::into_inner)
}

/// Write access to `dst` and read access to `src`, two different
/// storages, locked in address order so that a copy a -> b on one thread
/// and b -> a on another cannot deadlock.
pub(crate) fn write_and_read<'s, 'a, 'b>(
    dst: &'s SharedStorage<'a>,
    src: &'s SharedStorage<'b>,
) -> (
    RwLockWriteGuard<'s, Storage<'a>>,
    RwLockReadGuard<'s, Storage<'b>>,
) {
    if Arc::as_ptr(dst).cast::<()>() < Arc::as_ptr(src).cast::<()>() {
        let dst = write(dst);
        (dst, read(src))
    } else {
        let src = read(src);
        (write(dst), src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_storage_exposes_the_vec_bytes_without_copying() {
        let data = vec![1.0f32, 2.0];
        let ptr = data.as_ptr() as *const u8;
        let storage = Storage::from_vec(data);
        assert_eq!(storage.bytes().unwrap().as_ptr(), ptr);
        assert_eq!(storage.nbytes(), 8);
        assert_eq!(storage.device(), Device::Cpu);
        match storage.into_memory() {
            Memory::HostOwned(buffer) => {
                assert_eq!(buffer.holds(), "Vec<f32>");
                let back = buffer.into_any().downcast::<Vec<f32>>().unwrap();
                assert_eq!(back.as_ptr() as *const u8, ptr);
            }
            _ => panic!("owned storage became something else"),
        }
    }

    #[test]
    fn borrowed_storage_writes_land_in_the_callers_memory() {
        let mut data = [0u16; 3];
        {
            let mut storage = Storage::borrowed(bytemuck::cast_slice_mut(&mut data));
            storage.bytes_mut().unwrap()[2..4].copy_from_slice(&7u16.to_ne_bytes());
        }
        assert_eq!(data, [0, 7, 0]);
    }

    #[test]
    fn zeros_allocates_the_dtype_type() {
        for dtype in DType::ALL {
            let storage = Storage::zeros(dtype, 5);
            assert_eq!(storage.nbytes(), 5 * dtype.size());
            assert!(storage.bytes().unwrap().iter().all(|&b| b == 0));
        }
    }
}
