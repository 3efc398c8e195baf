//! Raw bytes: the dense span a transport sends, and taking an owned `Vec`
//! back out of a tensor.

use std::ops::Range;
use std::sync::{Arc, PoisonError};

use super::dense::Tensor;
use super::storage::{self, HostBuffer, Memory};
use super::{DType, Element};
use crate::{Error, Result};

impl<'a> Tensor<'a> {
    /// The byte range of the storage holding the elements of a
    /// non-overlapping and dense tensor: `offset * size .. (offset + numel) *
    /// size`. Its bytes are the elements in memory order (row-major for a
    /// contiguous tensor, NHWC for channels-last), which is what a transport
    /// sends and what a tensor with the same strides receives.
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let t = Tensor::zeros(&[4, 3], DType::F32)?;
    /// assert_eq!(t.narrow(0, 1, 2)?.dense_span_byte_range()?, 12..36);
    /// assert!(t.narrow(1, 0, 2)?.dense_span_byte_range().is_err()); // gaps
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn dense_span_byte_range(&self) -> Result<Range<usize>> {
        if !self.is_non_overlapping_and_dense() {
            return Err(Error::InvalidLayout(format!(
                "expected a non-overlapping and dense tensor (contiguous or a permutation of it), \
                 found shape {:?} with strides {:?}",
                self.shape(),
                self.strides()
            )));
        }
        let size = self.dtype.size();
        let start = self.offset() * size;
        Ok(start..start + self.nbytes())
    }

    /// Runs `f` on the bytes of the dense span (see
    /// [`dense_span_byte_range`](Tensor::dense_span_byte_range)) while holding
    /// a read lock on the storage.
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let t = Tensor::from_vec(vec![1i32, 2], &[2])?;
    /// let bytes = t.with_bytes(|b| b.to_vec())?;
    /// assert_eq!(bytes, [1i32.to_ne_bytes(), 2i32.to_ne_bytes()].concat());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let range = self.dense_span_byte_range()?;
        let guard = storage::read(&self.storage);
        Ok(f(&guard.bytes()?[range]))
    }

    /// Runs `f` on the writable bytes of the dense span while holding the
    /// write lock on the storage. Writing bytes that are not 0 or 1 into a
    /// bool tensor is allowed; such elements read back as `true`.
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let t = Tensor::zeros(&[2], DType::U8)?;
    /// t.with_bytes_mut(|b| b.copy_from_slice(&[7, 9]))?;
    /// assert_eq!(t.to_vec::<u8>()?, [7, 9]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        let range = self.dense_span_byte_range()?;
        let mut guard = storage::write(&self.storage);
        Ok(f(&mut guard.bytes_mut()?[range]))
    }

    /// A copy of the bytes of the dense span.
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let t = Tensor::zeros_channels_last(&[1, 2, 1, 2], DType::U8)?;
    /// t.copy_from(&Tensor::from_vec(vec![1u8, 2, 10, 20], &[1, 2, 1, 2])?)?;
    /// assert_eq!(t.dense_span_bytes()?, [1, 10, 2, 20]); // NHWC memory order
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn dense_span_bytes(&self) -> Result<Vec<u8>> {
        self.with_bytes(<[u8]>::to_vec)
    }

    /// Overwrites the dense span with `bytes`, which must be exactly
    /// [`nbytes`](Tensor::nbytes) long (the receiving side of
    /// [`dense_span_bytes`](Tensor::dense_span_bytes)).
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let src = Tensor::from_vec(vec![1.5f64, -2.0], &[2])?;
    /// let dst = src.empty_like_preserving_layout()?;
    /// dst.write_dense_span_bytes(&src.dense_span_bytes()?)?;
    /// assert_eq!(dst.to_vec::<f64>()?, [1.5, -2.0]);
    /// assert!(dst.write_dense_span_bytes(&[0; 3]).is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn write_dense_span_bytes(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() != self.nbytes() {
            return Err(Error::InvalidArgument(format!(
                "expected {} bytes for a {} tensor of shape {:?}, found {}",
                self.nbytes(),
                self.dtype,
                self.shape(),
                bytes.len()
            )));
        }
        self.with_bytes_mut(|span| span.copy_from_slice(bytes))
    }

    /// Gives back the `Vec` the tensor owns, without copying. Needs the
    /// tensor to be the only handle on a storage it owns, to cover it
    /// exactly in row-major order, and `T` to be its dtype; otherwise the
    /// error says which, and the tensor is dropped (other handles keep the
    /// storage alive).
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let data = vec![1i32, 2, 3, 4];
    /// let ptr = data.as_ptr();
    /// let t = Tensor::from_vec(data, &[2, 2])?;
    /// let back = t.into_vec::<i32>()?;
    /// assert_eq!(back.as_ptr(), ptr); // the same allocation
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn into_vec<T: Element>(self) -> Result<Vec<T>> {
        self.check_dtype(T::DTYPE, "into_vec")?;
        let buffer = self.into_host_buffer("into_vec")?;
        downcast_vec(buffer, T::DTYPE)
    }

    /// Gives back the `Vec<u8>` of 0/1 bytes a [`DType::Bool`] tensor owns,
    /// without copying (same conditions as [`into_vec`](Tensor::into_vec)).
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let t = Tensor::from_bools(&[true, false], &[2])?;
    /// assert_eq!(t.into_bool_bytes()?, [1, 0]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn into_bool_bytes(self) -> Result<Vec<u8>> {
        self.check_dtype(DType::Bool, "into_bool_bytes")?;
        let buffer = self.into_host_buffer("into_bool_bytes")?;
        downcast_vec(buffer, DType::Bool)
    }

    /// The owned buffer behind a sole, storage-covering, contiguous handle.
    fn into_host_buffer(self, op: &str) -> Result<Box<dyn HostBuffer>> {
        let storage_nbytes = self.storage_nbytes();
        if !self.is_contiguous() || self.offset() != 0 || self.nbytes() != storage_nbytes {
            return Err(Error::InvalidLayout(format!(
                "{op}: expected a contiguous tensor at offset 0 covering its whole storage of \
                 {storage_nbytes} bytes, found shape {:?}, strides {:?}, offset {} ({} bytes)",
                self.shape(),
                self.strides(),
                self.offset(),
                self.nbytes()
            )));
        }
        let lock = Arc::try_unwrap(self.storage).map_err(|shared| {
            Error::InvalidArgument(format!(
                "{op}: the storage is shared by {} handles; drop the other views first",
                Arc::strong_count(&shared)
            ))
        })?;
        match lock
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
            .into_memory()
        {
            Memory::HostOwned(buffer) => Ok(buffer),
            Memory::HostBorrowed(_) => Err(Error::InvalidArgument(format!(
                "{op}: the tensor borrows the caller's memory and owns no Vec to give back"
            ))),
            #[cfg(feature = "cuda")]
            _ => Err(Error::InvalidArgument(format!(
                "{op}: the tensor's memory is pinned or on a GPU, not a Vec; use to_vec"
            ))),
        }
    }
}

/// Recovers the `Vec<T>` behind an owned buffer.
fn downcast_vec<T: 'static>(buffer: Box<dyn HostBuffer>, dtype: DType) -> Result<Vec<T>> {
    let held = buffer.holds();
    buffer
        .into_any()
        .downcast::<Vec<T>>()
        .map(|vec| *vec)
        .map_err(|_| {
            Error::InvalidArgument(format!(
                "the storage of this {dtype} tensor holds {held}, expected a Vec<{}>",
                std::any::type_name::<T>()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn into_vec_round_trip_is_zero_copy() {
        let data: Vec<f64> = (0..10).map(f64::from).collect();
        let ptr = data.as_ptr();
        let t = Tensor::from_vec(data, &[2, 5]).unwrap();
        let back = t.view(&[10]).unwrap().into_vec::<f64>();
        // `t` is still alive, so the view is not the sole handle.
        assert!(
            matches!(back, Err(Error::InvalidArgument(m)) if m.contains("shared by 2 handles"))
        );
        let back = t.into_vec::<f64>().unwrap();
        assert_eq!(back.as_ptr(), ptr);
        assert_eq!(back, (0..10).map(f64::from).collect::<Vec<_>>());
        let zeros = Tensor::zeros(&[3], DType::I8)
            .unwrap()
            .into_vec::<i8>()
            .unwrap();
        assert_eq!(zeros, [0, 0, 0]);
    }

    #[test]
    fn into_vec_refuses_what_it_cannot_give_back() {
        let t = Tensor::from_vec(vec![0u8; 4], &[4]).unwrap();
        assert!(matches!(
            t.clone().into_vec::<i8>(),
            Err(Error::DTypeMismatch {
                expected: DType::I8,
                found: DType::U8,
                ..
            })
        ));
        let part = Tensor::from_vec(vec![0u8; 4], &[4])
            .unwrap()
            .narrow(0, 1, 2)
            .unwrap();
        assert!(
            matches!(part.into_vec::<u8>(), Err(Error::InvalidLayout(m)) if m.contains("offset 1"))
        );
        let permuted = Tensor::from_vec(vec![0u8; 4], &[2, 2])
            .unwrap()
            .permute(&[1, 0])
            .unwrap();
        assert!(matches!(
            permuted.into_vec::<u8>(),
            Err(Error::InvalidLayout(_))
        ));
        let mut user = [0u8; 4];
        let borrowed = Tensor::from_slice_mut(&mut user, &[4]).unwrap();
        assert!(
            matches!(borrowed.into_vec::<u8>(), Err(Error::InvalidArgument(m)) if m.contains("borrows"))
        );
        assert!(matches!(
            t.into_bool_bytes(),
            Err(Error::DTypeMismatch { .. })
        ));
    }

    #[test]
    fn bool_bytes_round_trip_is_zero_copy() {
        let bytes = vec![1u8, 0, 1];
        let ptr = bytes.as_ptr();
        let t = Tensor::from_bool_bytes(bytes, &[3]).unwrap();
        assert_eq!(t.to_vec_bool().unwrap(), [true, false, true]);
        let back = t.into_bool_bytes().unwrap();
        assert_eq!(back.as_ptr(), ptr);
    }

    #[test]
    fn borrowed_view_writes_land_in_the_users_slice() {
        let mut user = vec![0i32; 6];
        let ptr = user.as_ptr() as *const u8;
        {
            let t = Tensor::from_slice_mut(&mut user, &[2, 3]).unwrap();
            t.with_bytes(|b| assert_eq!(b.as_ptr(), ptr)).unwrap();
            let rows = t.chunk(2, 0).unwrap();
            rows[1].fill(4i32).unwrap();
            t.narrow(1, 0, 1)
                .unwrap()
                .copy_from(&Tensor::from_vec(vec![8i32, 9], &[2, 1]).unwrap())
                .unwrap();
        }
        assert_eq!(user, [8, 0, 0, 9, 4, 4]);
    }

    #[test]
    fn writing_span_bytes_checks_the_length() {
        let t = Tensor::zeros(&[2, 2], DType::I32).unwrap();
        match t.write_dense_span_bytes(&[0; 15]) {
            Err(Error::InvalidArgument(msg)) => assert!(
                msg.contains("expected 16 bytes") && msg.contains("found 15"),
                "{msg}"
            ),
            other => panic!("{other:?}"),
        }
        let gappy = t.narrow(1, 0, 1).unwrap();
        assert!(matches!(
            gappy.write_dense_span_bytes(&[0; 8]),
            Err(Error::InvalidLayout(_))
        ));
    }

    #[test]
    fn dense_span_of_permuted_and_offset_views() {
        let t = Tensor::from_vec((0..12u8).collect(), &[2, 3, 2]).unwrap();
        let p = t.permute(&[2, 0, 1]).unwrap();
        assert!(p.is_non_overlapping_and_dense() && !p.is_contiguous());
        assert_eq!(p.dense_span_bytes().unwrap(), (0..12).collect::<Vec<u8>>());
        let second = t.narrow(0, 1, 1).unwrap();
        assert_eq!(second.dense_span_byte_range().unwrap(), 6..12);
        second.with_bytes_mut(|b| b.fill(0)).unwrap();
        assert_eq!(
            t.to_vec::<u8>().unwrap(),
            [0, 1, 2, 3, 4, 5, 0, 0, 0, 0, 0, 0]
        );
        let gappy = t.narrow(2, 0, 1).unwrap();
        assert!(matches!(
            gappy.with_bytes(|_| ()),
            Err(Error::InvalidLayout(_))
        ));
        assert!(matches!(
            gappy.with_bytes_mut(|_| ()),
            Err(Error::InvalidLayout(_))
        ));
        let empty = t.narrow(0, 0, 0).unwrap();
        assert_eq!(empty.dense_span_bytes().unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn channels_last_bytes_survive_a_round_trip_with_strides() {
        let logical: Vec<i32> = (0..24).collect();
        let src = Tensor::zeros_channels_last(&[2, 3, 2, 2], DType::I32).unwrap();
        src.copy_from(&Tensor::from_vec(logical.clone(), &[2, 3, 2, 2]).unwrap())
            .unwrap();
        let wire = src.dense_span_bytes().unwrap();
        let dst = src.empty_like_preserving_layout().unwrap();
        dst.write_dense_span_bytes(&wire).unwrap();
        assert!(dst.is_channels_last());
        assert_eq!(dst.to_vec::<i32>().unwrap(), logical);
        // The wire bytes are NHWC: the first three are channels 0, 1, 2 of (n0, h0, w0).
        let first: Vec<i32> = wire[..12]
            .chunks_exact(4)
            .map(bytemuck::pod_read_unaligned)
            .collect();
        assert_eq!(first, [0, 4, 8]);
        // A contiguous receiver with the same bytes would read different values.
        let wrong = Tensor::zeros(&[2, 3, 2, 2], DType::I32).unwrap();
        wrong.write_dense_span_bytes(&wire).unwrap();
        assert_ne!(wrong.to_vec::<i32>().unwrap(), logical);
    }
}
