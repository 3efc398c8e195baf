//! Arrays handed over from Python as (address, dtype, shape, strides),
//! plus, for a CUDA tensor, (device, stream): viewed as tensors without a
//! copy.
//!
//! The Python side (`tensorcomm._arrays`) reads these from a NumPy array's
//! `__array_interface__` or a PyTorch tensor's `data_ptr()`, `stride()`,
//! `dtype` and device, and passes the array objects along; [`crate::work`]
//! keeps those objects alive until the collective has finished with the
//! memory. A CUDA tensor also names the caller's current stream on its
//! device (`torch.cuda.current_stream(device).cuda_stream`): the call is
//! ordered after the work queued there ([`StreamGuard`]).

use half::{bf16, f16};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use tensorcomm::cuda::runtime::{set_current_stream, CurrentStreamGuard, Stream};
use tensorcomm::tensor::{contiguous_strides, DType, Element, Layout, Tensor};

use crate::errors::{py_err, raise};

/// What Python passes for one array: `(address, dtype code, shape,
/// strides)` for host memory, `(address, dtype code, shape, strides,
/// (device, stream))` for GPU memory. The dtype code is the index in
/// [`DType::ALL`]; strides are in elements (`None`: contiguous).
pub(crate) struct Desc {
    address: usize,
    code: u8,
    shape: Vec<usize>,
    strides: Option<Vec<i64>>,
    cuda: Option<CudaPlace>,
}

/// Where a CUDA tensor lives and the caller's current stream there (a raw
/// `CUstream` address; 0: the legacy default stream).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CudaPlace {
    pub(crate) device: usize,
    pub(crate) stream: usize,
}

impl<'py> FromPyObject<'py> for CudaPlace {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        let (device, stream): (usize, usize) = ob.extract()?;
        Ok(CudaPlace { device, stream })
    }
}

impl<'py> FromPyObject<'py> for Desc {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        let tuple = ob.downcast::<PyTuple>()?;
        let cuda = match tuple.len() {
            4 => None,
            5 => tuple.get_item(4)?.extract()?,
            n => {
                return Err(raise(
                    "InvalidArgumentError",
                    format!(
                        "expected an array descriptor (address, dtype, shape, strides[, (device, stream)]), \
                         found a tuple of {n} items"
                    ),
                ))
            }
        };
        Ok(Desc {
            address: tuple.get_item(0)?.extract()?,
            code: tuple.get_item(1)?.extract()?,
            shape: tuple.get_item(2)?.extract()?,
            strides: tuple.get_item(3)?.extract()?,
            cuda,
        })
    }
}

impl Desc {
    /// The GPU and caller's stream of a CUDA array; `None` for host memory.
    pub(crate) fn cuda(&self) -> Option<CudaPlace> {
        self.cuda
    }
}

/// The caller's stream of the first CUDA array among `descs`: every CUDA
/// tensor of a call is on one GPU (the group checks it), so one stream
/// orders the call.
pub(crate) fn caller_stream<'a>(descs: impl IntoIterator<Item = &'a Desc>) -> Option<CudaPlace> {
    descs.into_iter().find_map(Desc::cuda)
}

/// Makes the caller's stream (PyTorch's current stream on the call's GPU)
/// tensorcomm's current stream on this thread while it lives: the group
/// orders its copies after that stream, and `Work::wait` makes it wait.
/// Hold it on the thread that starts or waits on the collective.
pub(crate) struct StreamGuard {
    _current: Option<CurrentStreamGuard>,
}

impl StreamGuard {
    pub(crate) fn new(place: Option<CudaPlace>) -> tensorcomm::Result<StreamGuard> {
        let Some(CudaPlace { device, stream }) = place else {
            return Ok(StreamGuard { _current: None });
        };
        // SAFETY: `stream` is PyTorch's current stream on `device`, read by
        // the Python caller just before this call: a live stream of the
        // device's primary context (PyTorch's streams are never destroyed
        // while current), or 0. The handle lives only as long as this
        // guard, within the native call that the caller is blocked in.
        let stream = unsafe { Stream::from_raw(device, stream)? };
        Ok(StreamGuard {
            _current: Some(set_current_stream(&stream)),
        })
    }
}

/// The dtype with index `code` in [`DType::ALL`].
pub(crate) fn dtype_of(code: u8) -> PyResult<DType> {
    DType::ALL.get(code as usize).copied().ok_or_else(|| {
        raise(
            "InvalidArgumentError",
            format!(
                "expected a dtype code in 0..{}, found {code}",
                DType::ALL.len()
            ),
        )
    })
}

/// A tensor over the memory `desc` describes (host or GPU).
///
/// Contiguous arrays and dense permuted ones (no gaps, no overlap: a
/// transposed matrix, channels-last images) are viewed in place; others
/// are refused with an error naming their strides.
pub(crate) fn view(desc: &Desc) -> PyResult<Tensor<'static>> {
    let Desc {
        address,
        code,
        shape,
        strides,
        cuda,
    } = desc;
    let dtype = dtype_of(*code)?;
    let numel = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| raise("InvalidArgumentError", format!("shape {shape:?} overflows")))?;
    if numel == 0 {
        // Nothing to move: a host placeholder of the same shape.
        return Tensor::zeros(shape, dtype).map_err(py_err);
    }
    if *address == 0 || address % dtype.size() != 0 {
        return Err(raise(
            "InvalidArgumentError",
            format!(
                "expected an array address aligned to its {dtype} elements ({} bytes), found {address:#x}",
                dtype.size()
            ),
        ));
    }
    let strides = element_strides(shape, strides.as_deref())?;
    let order = dense_order(shape, &strides).ok_or_else(|| {
        raise(
            "InvalidArgumentError",
            format!(
                "expected a contiguous or densely permuted array (no gaps, no overlap), \
                 found shape {shape:?} with strides {strides:?} (in elements); pass a contiguous copy"
            ),
        )
    })?;
    if let Some(place) = cuda {
        let layout = Layout::new(shape, &strides, 0).map_err(py_err)?;
        // SAFETY: the Python caller passed the device address, layout and
        // dtype of a live CUDA tensor of PyTorch (allocated by the CUDA
        // runtime in the device's primary context) whose object travels
        // with the collective's Work (see `work::PyWork::new`) and is
        // released only once the collective is done with the memory; the
        // layout is dense (checked above), so it reaches `numel` elements.
        return unsafe {
            Tensor::from_cuda_raw_parts(place.device, *address as u64, dtype, layout)
        }
        .map_err(py_err);
    }
    let outer_shape: Vec<usize> = order.iter().map(|&d| shape[d]).collect();
    let base = contiguous_view(*address, dtype, numel, &outer_shape)?;
    if order.iter().enumerate().all(|(i, &d)| i == d) {
        return Ok(base);
    }
    // `base` has dims in memory order; put each back where the caller has it.
    let mut back = vec![0; order.len()];
    for (i, &d) in order.iter().enumerate() {
        back[d] = i;
    }
    base.permute(&back).map_err(py_err)
}

/// Strides in elements, checked to be non-negative, one per dimension.
fn element_strides(shape: &[usize], strides: Option<&[i64]>) -> PyResult<Vec<usize>> {
    let Some(strides) = strides else {
        return Ok(contiguous_strides(shape));
    };
    if strides.len() != shape.len() {
        return Err(raise(
            "InvalidArgumentError",
            format!(
                "expected {} strides for shape {shape:?}, found {strides:?}",
                shape.len()
            ),
        ));
    }
    strides
        .iter()
        .map(|&s| {
            usize::try_from(s).map_err(|_| {
                raise(
                    "InvalidArgumentError",
                    format!("expected non-negative strides, found {strides:?} (a reversed view); pass a copy"),
                )
            })
        })
        .collect()
}

/// The dimensions from outermost to innermost in memory, when the strides
/// lay the elements out densely (a permutation of a contiguous layout);
/// `None` otherwise. Dimensions of extent 1 go first: their stride does
/// not matter.
fn dense_order(shape: &[usize], strides: &[usize]) -> Option<Vec<usize>> {
    let mut order: Vec<usize> = (0..shape.len()).collect();
    // Stable sort: equal strides keep the caller's order.
    order.sort_by(|&a, &b| {
        let key = |d: usize| (shape[d] != 1, std::cmp::Reverse(strides[d]));
        key(a).cmp(&key(b))
    });
    let mut expected = 1usize;
    for &d in order.iter().rev() {
        if shape[d] == 1 {
            continue;
        }
        if strides[d] != expected {
            return None;
        }
        expected = expected.checked_mul(shape[d])?;
    }
    Some(order)
}

/// A contiguous tensor of `shape` over `numel` elements of `dtype` at
/// `address`.
fn contiguous_view(
    address: usize,
    dtype: DType,
    numel: usize,
    shape: &[usize],
) -> PyResult<Tensor<'static>> {
    fn typed<T: Element>(
        address: usize,
        numel: usize,
        shape: &[usize],
    ) -> PyResult<Tensor<'static>> {
        // SAFETY: the Python caller passed the address, element count and
        // dtype of a live array whose object travels with the collective's
        // Work (see `work::PyWork::new`) and is released only once the
        // collective is done with the memory; the address is non-null and
        // aligned (checked by `view`).
        let data: &'static mut [T] =
            unsafe { std::slice::from_raw_parts_mut(address as *mut T, numel) };
        Tensor::from_slice_mut(data, shape).map_err(py_err)
    }
    match dtype {
        DType::F32 => typed::<f32>(address, numel, shape),
        DType::F64 => typed::<f64>(address, numel, shape),
        DType::F16 => typed::<f16>(address, numel, shape),
        DType::BF16 => typed::<bf16>(address, numel, shape),
        DType::I8 => typed::<i8>(address, numel, shape),
        DType::U8 => typed::<u8>(address, numel, shape),
        DType::I32 => typed::<i32>(address, numel, shape),
        DType::I64 => typed::<i64>(address, numel, shape),
        DType::Bool => {
            // SAFETY: as in `typed`; bool arrays hold one byte per element.
            let bytes: &'static mut [u8] =
                unsafe { std::slice::from_raw_parts_mut(address as *mut u8, numel) };
            Tensor::from_bool_bytes_mut(bytes, shape).map_err(py_err)
        }
    }
}

/// [`view`] of each of `descs`.
pub(crate) fn views(descs: &[Desc]) -> PyResult<Vec<Tensor<'static>>> {
    descs.iter().map(view).collect()
}
