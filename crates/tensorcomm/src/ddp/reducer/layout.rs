//! Where each parameter's gradient lives: the Reducer's buckets (a flat
//! buffer each) and each parameter's bucket and offset.

use crate::ddp::flat_buffer::{view_of, zeros_on};
use crate::ddp::{compute_bucket_assignment_by_size, GradBucket, TensorSpec};
use crate::tensor::Tensor;
use crate::Result;

/// One bucket: its parameters in buffer order and its flat buffer.
pub(super) struct Bucket {
    pub(super) params: Vec<usize>,
    pub(super) buffer: Tensor<'static>,
}

/// The buckets, reduced in index order, and each parameter's place.
pub(super) struct BucketLayout {
    pub(super) buckets: Vec<Bucket>,
    /// For each parameter: its bucket and its offset in that bucket.
    place: Vec<(usize, usize)>,
}

impl BucketLayout {
    /// Buckets filled in `order` (the order gradients are expected to
    /// arrive), the first against `first_bytes`, the others against
    /// `cap_bytes`.
    pub(super) fn new(
        params: &[TensorSpec],
        order: &[usize],
        first_bytes: usize,
        cap_bytes: usize,
    ) -> Result<BucketLayout> {
        let ordered: Vec<TensorSpec> = order.iter().map(|&i| params[i].clone()).collect();
        let assignment = compute_bucket_assignment_by_size(
            &ordered,
            &[first_bytes.max(1), cap_bytes.max(1)],
            &[],
            order,
        )?;
        let mut place = vec![(0, 0); params.len()];
        let mut buckets = Vec::with_capacity(assignment.buckets.len());
        for (b, members) in assignment.buckets.into_iter().enumerate() {
            let mut offset = 0;
            for &p in &members {
                place[p] = (b, offset);
                offset += params[p].numel();
            }
            let first = &params[members[0]];
            buckets.push(Bucket {
                buffer: zeros_on(offset, first.dtype, first.device)?,
                params: members,
            });
        }
        Ok(BucketLayout { buckets, place })
    }

    /// The bucket holding parameter `param`.
    pub(super) fn bucket_of(&self, param: usize) -> usize {
        self.place[param].0
    }

    /// Parameter `param`'s gradient: a view into its bucket's buffer.
    pub(super) fn view(&self, params: &[TensorSpec], param: usize) -> Result<Tensor<'static>> {
        let (b, offset) = self.place[param];
        view_of(&self.buckets[b].buffer, offset, &params[param].shape)
    }

    /// Bucket `b` as a hook sees it.
    pub(super) fn grad_bucket(&self, params: &[TensorSpec], b: usize) -> Result<GradBucket> {
        let bucket = &self.buckets[b];
        GradBucket::new(
            b,
            self.buckets.len(),
            bucket.buffer.clone(),
            bucket
                .params
                .iter()
                .map(|&p| params[p].shape.clone())
                .collect(),
            bucket.params.clone(),
        )
    }
}
