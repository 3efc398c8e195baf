//! A large host-to-host copy split across threads: one memory-bound
//! `memcpy` on one core moves 5-10 GB/s, well short of what a host's
//! memory gives several cores at once (DDP's gradient copies into and out
//! of the buckets, ~100 MB a step, are the user).

use std::sync::{Mutex, PoisonError};

use super::data::same_dense_order;
use super::dense::Tensor;
use super::storage;
use crate::Result;

/// The smallest part a copy is split into: below it a thread's start
/// (tens of microseconds) costs more than its share saves.
const MIN_PART_BYTES: usize = 1 << 20;

impl Tensor<'_> {
    /// [`copy_from`](Tensor::copy_from) on up to `threads` threads (this
    /// one included) when both tensors are on the host in separate
    /// storages, dense in the same order, and the copy is at least two
    /// parts of [`MIN_PART_BYTES`]; otherwise, and where no thread can be
    /// started, on this thread alone. The storages' locks are taken once
    /// (in address order, as `copy_from` does); the span is cut into
    /// `threads` parts (multiples of 64 bytes, the last one shorter), which
    /// this thread and the helpers take from a queue. Returns how many
    /// parts the copy was cut into (1: one plain copy).
    pub(crate) fn copy_from_split(&self, src: &Tensor<'_>, threads: usize) -> Result<usize> {
        let parts = threads.min(self.nbytes() / MIN_PART_BYTES);
        let plain = parts >= 2
            && self.device().is_cpu()
            && src.device().is_cpu()
            && self.dtype() == src.dtype()
            && self.shape() == src.shape()
            && !self.shares_storage(src)
            && same_dense_order(self.layout(), src.layout());
        let spans = (self.layout().span(), src.layout().span());
        let (true, (Some(dst_span), Some(src_span))) = (plain, spans) else {
            return self.copy_from(src).map(|()| 1);
        };
        self.check_writable("copy_from")?;
        let size = self.dtype().size();
        let (mut dst_guard, src_guard) = storage::write_and_read(&self.storage, &src.storage);
        let to = &mut dst_guard.bytes_mut()?[dst_span.start * size..dst_span.end * size];
        let from = &src_guard.bytes()?[src_span.start * size..src_span.end * size];
        // Parts of a multiple of 64 bytes (whole cache lines when the span
        // starts on one), the last one shorter, taken from a queue by this
        // thread and the helpers: a helper that cannot be started leaves
        // its parts to the others.
        let part = to.len().div_ceil(parts).next_multiple_of(64);
        let count = to.len().div_ceil(part);
        let queue = Mutex::new(to.chunks_mut(part).zip(from.chunks(part)));
        let work = || loop {
            let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
            let Some((d, s)) = next else { break };
            d.copy_from_slice(s);
        };
        std::thread::scope(|scope| {
            for _ in 1..parts {
                let started = std::thread::Builder::new()
                    .name("tensorcomm-copy".into())
                    .spawn_scoped(scope, work);
                if started.is_err() {
                    break;
                }
            }
            work();
        });
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    fn ramp(n: usize) -> Tensor<'static> {
        Tensor::from_vec((0..n).map(|i| i as f32).collect(), &[n]).unwrap()
    }

    #[test]
    fn a_split_copy_moves_every_element_for_sizes_around_the_part_size() {
        let part = MIN_PART_BYTES / 4;
        for n in [
            1,
            1000,
            part - 1,
            part,
            2 * part,
            2 * part + 3,
            7 * part + 13,
        ] {
            for threads in [1, 2, 3, 8] {
                let src = ramp(n);
                let dst = Tensor::zeros(&[n], DType::F32).unwrap();
                let parts = dst.copy_from_split(&src, threads).unwrap();
                // Fewer than two parts' worth is one plain copy.
                let expected = match threads.min(4 * n / MIN_PART_BYTES) {
                    p if p >= 2 => p,
                    _ => 1,
                };
                assert_eq!(parts, expected, "{n} elements on {threads} threads");
                assert_eq!(dst.to_vec::<f32>().unwrap(), src.to_vec::<f32>().unwrap());
            }
        }
    }

    #[test]
    fn a_split_copy_into_a_view_touches_only_the_view() {
        let n = 3 * MIN_PART_BYTES / 4;
        let buffer = Tensor::from_vec(vec![-1.0f32; n + 10], &[n + 10]).unwrap();
        let view = buffer.narrow(0, 5, n).unwrap();
        assert_eq!(view.copy_from_split(&ramp(n), 4).unwrap(), 3);
        let all = buffer.to_vec::<f32>().unwrap();
        assert_eq!(all[..5], [-1.0; 5]);
        assert_eq!(all[n + 5..], [-1.0; 5]);
        assert!(all[5..n + 5]
            .iter()
            .enumerate()
            .all(|(i, &v)| v == i as f32));
    }

    #[test]
    fn a_split_copy_checks_like_copy_from() {
        let n = 2 * MIN_PART_BYTES;
        let dst = Tensor::zeros(&[n], DType::F32).unwrap();
        assert!(dst.copy_from_split(&ramp(n + 1), 4).is_err());
        let f64s = Tensor::zeros(&[n], DType::F64).unwrap();
        assert!(dst.copy_from_split(&f64s, 4).is_err());
        // Overlapping copies inside one storage still go through copy_from.
        let both = ramp(2 * n);
        let (a, b) = (both.narrow(0, 0, n).unwrap(), both.narrow(0, 1, n).unwrap());
        assert_eq!(a.copy_from_split(&b, 4).unwrap(), 1);
        assert_eq!(a.to_vec::<f32>().unwrap()[..3], [1.0, 2.0, 3.0]);
    }
}
