//! Low-precision compression hooks: reduce a bucket in f16 or bf16 and
//! write the result back into the original-precision buffer (c10d's
//! `fp16_compress_hook`, `bf16_compress_hook` and their wrappers).

use std::sync::Arc;

use super::flat_buffer::{cast_into, zeros_on};
use super::{AllReduceHook, CommHook, GradBucket};
use crate::group::{ProcessGroup, WorkFuture};
use crate::tensor::{DType, Tensor};
use crate::Result;

/// Reduces each bucket in a lower precision: casts the buffer to `dtype`
/// (f16 or bf16), runs the inner hook on the compressed copy, and casts
/// the result back into the original buffer.
///
/// [`CompressHook::fp16`] and [`CompressHook::bf16`] wrap the all-reduce
/// hook (cast, divide by the world size in the low precision, sum, write
/// back): c10d's `fp16_compress_hook` and `bf16_compress_hook`.
/// [`CompressHook::wrap`] wraps any hook (c10d's `fp16_compress_wrapper`).
///
/// ```
/// use tensorcomm::ddp::{CommHook, CompressHook, GradBucket};
/// use tensorcomm::tensor::{DType, Tensor};
///
/// let pg = tensorcomm::init_process_group(tensorcomm::Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
/// let bucket = GradBucket::new(0, 1, Tensor::from_vec(vec![1.0f32 / 3.0], &[1])?, vec![vec![1]], vec![0])?;
/// let out = CompressHook::fp16().run(&pg, bucket)?.wait()?;
/// assert_eq!(out.dtype(), DType::F32);
/// assert_eq!(out.to_vec::<f32>()?, [half::f16::from_f32(1.0 / 3.0).to_f32()]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct CompressHook {
    dtype: DType,
    inner: Arc<dyn CommHook>,
}

impl CompressHook {
    /// All-reduce in f16.
    pub fn fp16() -> CompressHook {
        CompressHook {
            dtype: DType::F16,
            inner: Arc::new(AllReduceHook),
        }
    }

    /// All-reduce in bf16.
    pub fn bf16() -> CompressHook {
        CompressHook {
            dtype: DType::BF16,
            inner: Arc::new(AllReduceHook),
        }
    }

    /// Runs `inner` on a copy of each bucket cast to `dtype` (f16 or
    /// bf16); an error for any other dtype.
    pub fn wrap(dtype: DType, inner: Arc<dyn CommHook>) -> Result<CompressHook> {
        if !matches!(dtype, DType::F16 | DType::BF16) {
            return Err(crate::Error::BadValue {
                name: "CompressHook::wrap dtype".into(),
                expected: "f16 or bf16".into(),
                found: dtype.to_string(),
            });
        }
        Ok(CompressHook { dtype, inner })
    }
}

impl CommHook for CompressHook {
    fn run(
        &self,
        group: &Arc<dyn ProcessGroup>,
        mut bucket: GradBucket,
    ) -> Result<WorkFuture<Tensor<'static>>> {
        let original = bucket.buffer().clone();
        let compressed = zeros_on(original.numel(), self.dtype, original.device())?;
        cast_into(&compressed, &original, "CompressHook")?;
        bucket.set_buffer(compressed)?;
        let future = self.inner.run(group, bucket)?;
        Ok(future.then(move |reduced| {
            cast_into(&original, &reduced?, "CompressHook")?;
            Ok(original)
        }))
    }
}
