//! `GradBucket`: what a communication hook gets, one bucket of gradients
//! laid out in one flat buffer (c10d's `GradBucket`).

use super::flat_buffer::view_of;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// One bucket of gradients in one flat buffer, handed to a
/// [`CommHook`](super::CommHook).
///
/// Gradient `i` of the bucket (of parameter `parameter_indices()[i]`)
/// occupies elements `offsets()[i]..offsets()[i] + lengths()[i]` of the
/// buffer, with shape `shapes()[i]`.
///
/// ```
/// use tensorcomm::ddp::GradBucket;
/// use tensorcomm::tensor::Tensor;
///
/// let buffer = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0], &[5])?;
/// let bucket = GradBucket::new(0, 2, buffer, vec![vec![2, 2], vec![1]], vec![3, 7])?;
/// assert_eq!(bucket.offsets(), [0, 4]);
/// assert_eq!(bucket.lengths(), [4, 1]);
/// let grads = bucket.gradients()?;
/// assert_eq!(grads[0].shape(), [2, 2]);
/// assert_eq!(grads[1].to_vec::<f32>()?, [5.0]);
/// assert!(!bucket.is_last());
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct GradBucket {
    index: usize,
    num_buckets: usize,
    buffer: Tensor<'static>,
    offsets: Vec<usize>,
    lengths: Vec<usize>,
    shapes: Vec<Vec<usize>>,
    parameter_indices: Vec<usize>,
}

impl GradBucket {
    /// Bucket `index` of `num_buckets`, holding gradients of `shapes`
    /// (of parameters `parameter_indices`) packed in order into the flat,
    /// contiguous `buffer`, which has exactly their elements.
    pub fn new(
        index: usize,
        num_buckets: usize,
        buffer: Tensor<'static>,
        shapes: Vec<Vec<usize>>,
        parameter_indices: Vec<usize>,
    ) -> Result<GradBucket> {
        if index >= num_buckets {
            return Err(Error::InvalidArgument(format!(
                "GradBucket: expected a bucket index in 0..{num_buckets}, found {index}"
            )));
        }
        if shapes.len() != parameter_indices.len() {
            return Err(Error::InvalidArgument(format!(
                "GradBucket: expected one parameter index per gradient ({}), found {}",
                shapes.len(),
                parameter_indices.len()
            )));
        }
        let lengths: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
        let offsets = lengths
            .iter()
            .scan(0, |next, &len| {
                let offset = *next;
                *next += len;
                Some(offset)
            })
            .collect();
        let total: usize = lengths.iter().sum();
        check_flat(&buffer, total, "GradBucket::new")?;
        Ok(GradBucket {
            index,
            num_buckets,
            buffer,
            offsets,
            lengths,
            shapes,
            parameter_indices,
        })
    }

    /// This bucket's index; bucket 0 is reduced first.
    pub fn index(&self) -> usize {
        self.index
    }

    /// How many buckets the model's gradients are split into.
    pub fn num_buckets(&self) -> usize {
        self.num_buckets
    }

    /// True for the last bucket reduced in an iteration (hooks that keep
    /// per-iteration state, such as PowerSGD, count iterations with it).
    pub fn is_last(&self) -> bool {
        self.index + 1 == self.num_buckets
    }

    /// The flat buffer holding every gradient of the bucket (a handle: it
    /// shares storage with the bucket, so writes through it are the
    /// bucket's).
    pub fn buffer(&self) -> &Tensor<'static> {
        &self.buffer
    }

    /// Replaces the flat buffer, for example by a compressed copy that a
    /// wrapped hook reduces instead. The new buffer is flat and contiguous
    /// with the same number of elements; its dtype may differ.
    ///
    /// ```
    /// use tensorcomm::ddp::GradBucket;
    /// use tensorcomm::tensor::{DType, Tensor};
    ///
    /// let mut bucket = GradBucket::new(0, 1, Tensor::zeros(&[3], DType::F32)?, vec![vec![3]], vec![0])?;
    /// bucket.set_buffer(Tensor::zeros(&[3], DType::F16)?)?;
    /// assert_eq!(bucket.buffer().dtype(), DType::F16);
    /// assert!(bucket.set_buffer(Tensor::zeros(&[4], DType::F16)?).is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn set_buffer(&mut self, buffer: Tensor<'static>) -> Result<()> {
        check_flat(&buffer, self.buffer.numel(), "GradBucket::set_buffer")?;
        self.buffer = buffer;
        Ok(())
    }

    /// Where each gradient starts in the buffer, in elements.
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// Each gradient's number of elements.
    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }

    /// Each gradient's shape.
    pub fn shapes(&self) -> &[Vec<usize>] {
        &self.shapes
    }

    /// The index (in the model's parameter list) of each gradient's
    /// parameter.
    pub fn parameter_indices(&self) -> &[usize] {
        &self.parameter_indices
    }

    /// Each gradient as a view into the buffer, with its shape.
    pub fn gradients(&self) -> Result<Vec<Tensor<'static>>> {
        self.offsets
            .iter()
            .zip(&self.shapes)
            .map(|(&offset, shape)| view_of(&self.buffer, offset, shape))
            .collect()
    }
}

/// Checks that `buffer` is a flat contiguous tensor of `numel` elements.
fn check_flat(buffer: &Tensor<'_>, numel: usize, context: &str) -> Result<()> {
    if buffer.shape() != [numel] {
        return Err(Error::ShapeMismatch {
            context: format!("{context}: the bucket's flat buffer"),
            expected: vec![numel],
            found: buffer.shape().to_vec(),
        });
    }
    if !buffer.is_contiguous() {
        return Err(Error::InvalidLayout(format!(
            "{context}: expected a contiguous flat buffer, found strides {:?}",
            buffer.strides()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    #[test]
    fn gradients_are_views_that_write_through() {
        let buffer = Tensor::zeros(&[7], DType::F32).unwrap();
        let bucket =
            GradBucket::new(1, 2, buffer.clone(), vec![vec![3], vec![2, 2]], vec![5, 4]).unwrap();
        assert!(bucket.is_last());
        assert_eq!(bucket.parameter_indices(), [5, 4]);
        assert_eq!(bucket.shapes(), [vec![3], vec![2, 2]]);
        bucket.gradients().unwrap()[1].fill(2.0f32).unwrap();
        assert_eq!(
            buffer.to_vec::<f32>().unwrap(),
            [0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0]
        );
    }

    #[test]
    fn wrong_buffers_and_indices_are_refused() {
        let e = GradBucket::new(
            0,
            1,
            Tensor::zeros(&[5], DType::F32).unwrap(),
            vec![vec![4]],
            vec![0],
        )
        .unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        let e = GradBucket::new(
            2,
            2,
            Tensor::zeros(&[4], DType::F32).unwrap(),
            vec![vec![4]],
            vec![0],
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("bucket index in 0..2, found 2"),
            "{e}"
        );
    }
}
