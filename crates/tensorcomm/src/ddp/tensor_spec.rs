//! `TensorSpec`: what bucketing needs to know about a tensor (shape,
//! dtype, device), without its data.

use crate::tensor::{DType, Device, Tensor};

/// The shape, dtype and device of a tensor: what bucket assignment and the
/// [`Reducer`](super::Reducer) need to know about a parameter.
///
/// ```
/// use tensorcomm::ddp::TensorSpec;
/// use tensorcomm::tensor::{DType, Device, Tensor};
///
/// let spec = TensorSpec::new(&[2, 3], DType::F32);
/// assert_eq!((spec.numel(), spec.nbytes(), spec.device), (6, 24, Device::Cpu));
/// assert_eq!(TensorSpec::of(&Tensor::zeros(&[2, 3], DType::F32)?), spec);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorSpec {
    /// The tensor's shape.
    pub shape: Vec<usize>,
    /// The tensor's element type.
    pub dtype: DType,
    /// Where the tensor lives.
    pub device: Device,
}

impl TensorSpec {
    /// A host tensor of `shape` and `dtype`.
    pub fn new(shape: &[usize], dtype: DType) -> TensorSpec {
        TensorSpec {
            shape: shape.to_vec(),
            dtype,
            device: Device::Cpu,
        }
    }

    /// The same spec on `device`.
    pub fn on(mut self, device: Device) -> TensorSpec {
        self.device = device;
        self
    }

    /// The spec of an existing tensor.
    pub fn of(tensor: &Tensor<'_>) -> TensorSpec {
        TensorSpec {
            shape: tensor.shape().to_vec(),
            dtype: tensor.dtype(),
            device: tensor.device(),
        }
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The number of bytes of the elements.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
}

impl std::fmt::Display for TensorSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{:?} on {}", self.dtype, self.shape, self.device)
    }
}
