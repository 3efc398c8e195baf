//! The tensor model: dtypes, devices, dense and sparse tensor handles.
//!
//! A [`Tensor`] is a handle, not a container: a [`DType`], a [`Layout`]
//! (shape, strides and offset, in elements) and a storage on a [`Device`]
//! that every view of it shares (`Arc<RwLock<..>>`). Views such as
//! [`Tensor::narrow`], [`Tensor::chunk`] and [`Tensor::permute`] never copy,
//! so scatter chunks and bucket slices write straight into the original
//! memory. Storage can own a `Vec<T>` (given back by [`Tensor::into_vec`]
//! without a copy) or borrow the caller's `&'a mut [T]`, which is why a
//! tensor carries the lifetime `'a`; owned tensors can be `Tensor<'static>`.
//!
//! Dense non-overlapping tensors, contiguous or permuted such as
//! channels-last, travel as the raw bytes of their span
//! ([`Tensor::with_bytes`]) and are received into a tensor with the same
//! strides ([`Tensor::empty_like_preserving_layout`]). [`SparseTensor`] is a
//! COO tensor (indices and values) for the sparse all-reduce.
//!
//! ```
//! use tensorcomm::tensor::{DType, Tensor};
//!
//! let mut grads = vec![0.0f32; 8];
//! {
//!     let t = Tensor::from_slice_mut(&mut grads, &[2, 4])?;
//!     let halves = t.chunk(2, 1)?; // two [2, 2] views
//!     halves[1].fill(1.0f32)?;
//! }
//! assert_eq!(grads, [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
//! # Ok::<(), tensorcomm::Error>(())
//! ```

#[cfg(feature = "cuda")]
mod cuda;
mod data;
mod dense;
mod device;
mod dtype;
mod element;
mod layout;
mod raw;
mod sparse;
mod split_copy;
mod storage;
mod views;

pub use dense::Tensor;
pub use device::Device;
pub use dtype::DType;
pub use element::Element;
pub use layout::{channels_last_strides, contiguous_strides, Layout, Offsets};
pub use sparse::SparseTensor;

#[cfg(feature = "cuda")]
pub(crate) use cuda::preserved_layout_of;
pub(crate) use storage::HostBuffer;
