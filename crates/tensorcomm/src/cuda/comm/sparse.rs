//! Dense and sparse tensors in one list ([`CommTensor`]), and the sparse
//! sum of `reduce_add`.

use crate::cuda::runtime;
use crate::tensor::{DType, Device, Layout, SparseTensor, Tensor};
use crate::{Error, Result};

use super::arg_error;
use super::copy::copy_pairs;
use super::group::Kind;
use super::reduce::reduce_add;

/// A dense or a sparse tensor: one entry of the lists that
/// [`broadcast_coalesced_mixed`](super::broadcast_coalesced_mixed) and
/// [`reduce_add_mixed`] take, as PyTorch's `torch.cuda.comm` takes dense and
/// sparse tensors in one list. A sparse tensor's device is its values'
/// device (its indices live on the host, see [`SparseTensor`]).
///
/// ```
/// use tensorcomm::cuda::comm::CommTensor;
/// use tensorcomm::tensor::{DType, SparseTensor, Tensor};
/// let items: Vec<CommTensor<'static>> = vec![
///     Tensor::zeros(&[2], DType::F32)?.into(),
///     SparseTensor::new(vec![1], Tensor::from_vec(vec![5i64], &[1])?, &[3])?.into(),
/// ];
/// assert!(!items[0].is_sparse() && items[1].is_sparse());
/// assert_eq!(items[1].dtype(), DType::I64);
/// assert!(items[1].clone().into_dense().is_err());
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[derive(Clone, Debug)]
pub enum CommTensor<'a> {
    /// A dense tensor.
    Dense(Tensor<'a>),
    /// A sparse COO tensor.
    Sparse(SparseTensor),
}

impl<'a> CommTensor<'a> {
    /// True for [`CommTensor::Sparse`].
    pub fn is_sparse(&self) -> bool {
        matches!(self, CommTensor::Sparse(_))
    }

    /// The device of the tensor (of the values, for a sparse one).
    pub fn device(&self) -> Device {
        match self {
            CommTensor::Dense(t) => t.device(),
            CommTensor::Sparse(s) => s.device(),
        }
    }

    /// The element type (of the values, for a sparse one).
    pub fn dtype(&self) -> DType {
        match self {
            CommTensor::Dense(t) => t.dtype(),
            CommTensor::Sparse(s) => s.dtype(),
        }
    }

    /// The full shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            CommTensor::Dense(t) => t.shape(),
            CommTensor::Sparse(s) => s.sizes(),
        }
    }

    /// Bytes counted against a bucket: the elements of a dense tensor; the
    /// indices and values of a sparse one (as PyTorch's `take_tensors`).
    pub fn nbytes(&self) -> usize {
        match self {
            CommTensor::Dense(t) => t.nbytes(),
            CommTensor::Sparse(s) => s.values().nbytes() + std::mem::size_of_val(s.indices()),
        }
    }

    /// The dense tensor, if this is one.
    pub fn as_dense(&self) -> Option<&Tensor<'a>> {
        match self {
            CommTensor::Dense(t) => Some(t),
            CommTensor::Sparse(_) => None,
        }
    }

    /// The sparse tensor, if this is one.
    pub fn as_sparse(&self) -> Option<&SparseTensor> {
        match self {
            CommTensor::Dense(_) => None,
            CommTensor::Sparse(s) => Some(s),
        }
    }

    /// The dense tensor; an [`Error::InvalidArgument`] for a sparse one.
    pub fn into_dense(self) -> Result<Tensor<'a>> {
        match self {
            CommTensor::Dense(t) => Ok(t),
            CommTensor::Sparse(s) => Err(Error::InvalidArgument(format!(
                "expected a dense tensor, found a sparse tensor of sizes {:?}",
                s.sizes()
            ))),
        }
    }

    /// The sparse tensor; an [`Error::InvalidArgument`] for a dense one.
    pub fn into_sparse(self) -> Result<SparseTensor> {
        match self {
            CommTensor::Sparse(s) => Ok(s),
            CommTensor::Dense(t) => Err(Error::InvalidArgument(format!(
                "expected a sparse tensor, found a dense tensor of shape {:?}",
                t.shape()
            ))),
        }
    }

    pub(crate) fn kind(&self) -> Kind {
        Kind {
            sparse: self.is_sparse(),
            dtype: self.dtype(),
        }
    }

    fn kind_name(&self) -> &'static str {
        if self.is_sparse() {
            "sparse"
        } else {
            "dense"
        }
    }
}

impl<'a> From<Tensor<'a>> for CommTensor<'a> {
    fn from(t: Tensor<'a>) -> Self {
        CommTensor::Dense(t)
    }
}

impl From<SparseTensor> for CommTensor<'_> {
    fn from(s: SparseTensor) -> Self {
        CommTensor::Sparse(s)
    }
}

/// [`reduce_add`] over a list of dense or sparse tensors, like PyTorch's
/// `reduce_add`: all dense gives [`reduce_add`]'s dense sum; all sparse
/// gives [`reduce_add_sparse`]'s sparse sum. A list mixing the two is an
/// [`Error::CommArgument`] naming the first input whose kind differs from
/// input 0.
///
/// ```no_run
/// use tensorcomm::cuda::comm::{reduce_add_mixed, CommTensor};
/// use tensorcomm::tensor::{Device, SparseTensor, Tensor};
/// let part = |i: i64, v: f32, d| -> tensorcomm::Result<CommTensor<'static>> {
///     let s = SparseTensor::new(vec![i], Tensor::from_vec(vec![v], &[1])?, &[4])?;
///     Ok(s.to_device(Device::Cuda(d))?.into())
/// };
/// let sum = reduce_add_mixed(&[part(1, 1.0, 0)?, part(3, 2.0, 1)?], 0)?.into_sparse()?;
/// assert_eq!(sum.to_dense()?.to_vec::<f32>()?, [0.0, 1.0, 0.0, 2.0]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn reduce_add_mixed<'a>(
    inputs: &[CommTensor<'a>],
    destination: usize,
) -> Result<CommTensor<'a>> {
    let Some(first) = inputs.first() else {
        return Err(arg_error(
            "reduce_add",
            "inputs",
            None,
            "at least one input tensor",
            "an empty list",
        ));
    };
    for (i, t) in inputs.iter().enumerate() {
        if t.is_sparse() != first.is_sparse() {
            return Err(arg_error(
                "reduce_add",
                "input tensor",
                Some(i),
                format!("a {} tensor (like input 0)", first.kind_name()),
                format!("a {} tensor", t.kind_name()),
            ));
        }
    }
    // Every input has input 0's kind, so these keep every input.
    if first.is_sparse() {
        let sparse: Vec<SparseTensor> = inputs
            .iter()
            .filter_map(|t| t.as_sparse().cloned())
            .collect();
        Ok(CommTensor::Sparse(reduce_add_sparse(&sparse, destination)?))
    } else {
        let dense: Vec<Tensor<'a>> = inputs
            .iter()
            .filter_map(|t| t.as_dense().cloned())
            .collect();
        Ok(CommTensor::Dense(reduce_add(&dense, destination)?))
    }
}

/// Sums sparse tensors onto GPU `destination` as PyTorch adds sparse
/// tensors: without coalescing. The inputs have one size, dtype and number
/// of dense dimensions, their values live on GPUs and one of them on
/// `destination`. The result's indices are every input's indices and its
/// values every input's values (copied to `destination`), concatenated
/// with the input on `destination` first and then the others in order;
/// [`coalesce`](SparseTensor::coalesce) sums the repeated coordinates and
/// [`to_dense`](SparseTensor::to_dense) gives the dense sum. With one
/// input, the result is that input. Errors name the offending input.
///
/// ```no_run
/// use tensorcomm::cuda::comm::reduce_add_sparse;
/// use tensorcomm::tensor::{Device, SparseTensor, Tensor};
/// let a = SparseTensor::new(vec![2], Tensor::from_vec(vec![1i32], &[1])?, &[3])?;
/// let b = SparseTensor::new(vec![2, 0], Tensor::from_vec(vec![5i32, 7], &[2])?, &[3])?;
/// let sum = reduce_add_sparse(&[a.to_device(Device::Cuda(0))?, b.to_device(Device::Cuda(1))?], 1)?;
/// assert_eq!(sum.device(), Device::Cuda(1));
/// assert_eq!((sum.nnz(), sum.indices()), (3, &[2, 0, 2][..])); // b first: it is on cuda:1
/// assert_eq!(sum.coalesce()?.values().to_vec::<i32>()?, [7, 6]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn reduce_add_sparse(inputs: &[SparseTensor], destination: usize) -> Result<SparseTensor> {
    const OP: &str = "reduce_add";
    const WHAT: &str = "sparse input tensor";
    let Some(first) = inputs.first() else {
        return Err(arg_error(
            OP,
            "inputs",
            None,
            "at least one input tensor",
            "an empty list",
        ));
    };
    for (i, s) in inputs.iter().enumerate() {
        if s.sizes() != first.sizes() {
            return Err(arg_error(
                OP,
                WHAT,
                Some(i),
                format!("sizes {:?} (like input 0)", first.sizes()),
                format!("sizes {:?}", s.sizes()),
            ));
        }
        if s.dtype() != first.dtype() {
            return Err(arg_error(
                OP,
                WHAT,
                Some(i),
                format!("dtype {} (like input 0)", first.dtype()),
                format!("dtype {}", s.dtype()),
            ));
        }
        if s.dense_dim() != first.dense_dim() {
            return Err(arg_error(
                OP,
                WHAT,
                Some(i),
                format!("{} dense dimensions (like input 0)", first.dense_dim()),
                format!("{} dense dimensions", s.dense_dim()),
            ));
        }
    }
    let mut root = None;
    for (i, s) in inputs.iter().enumerate() {
        match s.device() {
            Device::Cuda(d) => {
                if d == destination && root.is_none() {
                    root = Some(i);
                }
            }
            other => {
                return Err(arg_error(
                    OP,
                    WHAT,
                    Some(i),
                    "values on a GPU",
                    format!("values on {other}"),
                ))
            }
        }
    }
    let Some(root) = root else {
        let devices: Vec<String> = inputs.iter().map(|s| s.device().to_string()).collect();
        return Err(arg_error(
            OP,
            "destination",
            None,
            format!("the device of one of the inputs ({})", devices.join(", ")),
            format!("cuda:{destination}"),
        ));
    };
    if inputs.len() == 1 {
        return Ok(first.clone());
    }
    let order: Vec<&SparseTensor> = std::iter::once(&inputs[root])
        .chain(
            inputs
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != root)
                .map(|(_, s)| s),
        )
        .collect();
    let total: usize = order.iter().map(|s| s.nnz()).sum();
    let sparse_dim = first.sparse_dim();
    let mut indices = vec![0i64; sparse_dim * total];
    let mut at = 0;
    for s in &order {
        let nnz = s.nnz();
        for d in 0..sparse_dim {
            indices[d * total + at..d * total + at + nnz]
                .copy_from_slice(&s.indices()[d * nnz..(d + 1) * nnz]);
        }
        at += nnz;
    }
    let mut shape = first.values().shape().to_vec();
    shape[0] = total;
    let values = Tensor::uninit_cuda(
        Layout::contiguous(&shape),
        first.dtype(),
        &runtime::context(destination)?,
    )?;
    let mut parts = Vec::with_capacity(order.len());
    let mut at = 0;
    for s in &order {
        parts.push(values.narrow(0, at, s.nnz())?);
        at += s.nnz();
    }
    let pairs: Vec<(&Tensor<'_>, &Tensor<'_>)> = parts
        .iter()
        .zip(&order)
        .map(|(p, s)| (p, s.values()))
        .collect();
    copy_pairs(&pairs, &|_| None)?;
    SparseTensor::new(indices, values, first.sizes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sparse(indices: Vec<i64>, values: Vec<f32>, sizes: &[usize]) -> SparseTensor {
        let n = values.len();
        SparseTensor::new(indices, Tensor::from_vec(values, &[n]).unwrap(), sizes).unwrap()
    }

    fn arg(e: Result<impl std::fmt::Debug>) -> (Option<usize>, String) {
        let e = match e {
            Ok(v) => panic!("expected CommArgument, found Ok({v:?})"),
            Err(e) => e,
        };
        match &e {
            Error::CommArgument { index, .. } => (*index, e.to_string()),
            other => panic!("expected CommArgument, found {other:?}"),
        }
    }

    #[test]
    fn mixing_dense_and_sparse_names_the_first_odd_input() {
        let d = || CommTensor::from(Tensor::zeros(&[3], DType::F32).unwrap());
        let s = || CommTensor::from(sparse(vec![1], vec![1.0], &[3]));
        let (index, msg) = arg(reduce_add_mixed(&[d(), d(), s(), d()], 0));
        assert_eq!(index, Some(2), "{msg}");
        assert!(
            msg.contains("expected a dense tensor (like input 0), found a sparse tensor"),
            "{msg}"
        );
        let (index, msg) = arg(reduce_add_mixed(&[s(), d()], 0));
        assert_eq!(index, Some(1), "{msg}");
        assert!(msg.contains("expected a sparse tensor"), "{msg}");
        let (index, msg) = arg(reduce_add_mixed(&[], 0));
        assert_eq!(index, None);
        assert!(msg.contains("at least one input"), "{msg}");
        // All of one kind passes the kind check; host inputs then fail the
        // device check, input 0 first.
        let (index, msg) = arg(reduce_add_mixed(&[s(), s()], 0));
        assert_eq!(index, Some(0));
        assert!(
            msg.contains("values on a GPU, found values on cpu"),
            "{msg}"
        );
        let (index, msg) = arg(reduce_add_mixed(&[d(), d()], 0));
        assert_eq!(index, Some(0));
        assert!(msg.contains("a CUDA tensor"), "{msg}");
    }

    #[test]
    fn sparse_inputs_are_checked_against_input_0_before_devices() {
        let a = sparse(vec![0], vec![1.0], &[4]);
        let (index, msg) = arg(reduce_add_sparse(
            &[a.clone(), a.clone(), sparse(vec![0], vec![1.0], &[5])],
            0,
        ));
        assert_eq!(index, Some(2));
        assert!(
            msg.contains("sizes [4] (like input 0), found sizes [5]"),
            "{msg}"
        );
        let ints =
            SparseTensor::new(vec![0], Tensor::from_vec(vec![1i32], &[1]).unwrap(), &[4]).unwrap();
        let (index, msg) = arg(reduce_add_sparse(&[a.clone(), ints], 0));
        assert_eq!(index, Some(1));
        assert!(
            msg.contains("dtype f32") && msg.contains("found dtype i32"),
            "{msg}"
        );
        // Same sizes [4, 2], one sparse dimension against two.
        let rows = SparseTensor::new(
            vec![0],
            Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2]).unwrap(),
            &[4, 2],
        )
        .unwrap();
        let points = sparse(vec![0, 1], vec![1.0], &[4, 2]);
        let (index, msg) = arg(reduce_add_sparse(&[rows, points], 0));
        assert_eq!(index, Some(1));
        assert!(
            msg.contains("1 dense dimensions (like input 0), found 0"),
            "{msg}"
        );
    }

    #[test]
    fn comm_tensors_count_indices_and_values_against_buckets() {
        let s = CommTensor::from(sparse(vec![0, 1, 2, 3], vec![1.0, 2.0], &[4, 4]));
        assert_eq!(s.nbytes(), 4 * 8 + 2 * 4);
        assert_eq!(
            s.kind(),
            Kind {
                sparse: true,
                dtype: DType::F32
            }
        );
        assert_eq!(s.shape(), &[4, 4]);
        let d = CommTensor::from(Tensor::zeros(&[4, 4], DType::F32).unwrap());
        assert_eq!((d.nbytes(), d.kind()), (64, Kind::dense(DType::F32)));
        assert!(d.clone().into_sparse().is_err() && d.into_dense().is_ok());
        assert!(s.into_sparse().is_ok());
    }
}
