//! PowerSGD: low-rank gradient compression (Vogels et al., 2019), c10d's
//! `powerSGD_hook` with its `PowerSGDState`.
//!
//! Each gradient of a bucket is viewed as a matrix `M` (its first
//! dimension by the rest). A matrix whose rank-`r` factors would be small
//! enough is compressed: with `Q` (`m × r`, random or last iteration's),
//! `P = M Q` is summed over the ranks and orthogonalized, `Q = Mᵀ P` is
//! summed and divided by the world size, and `M` becomes `P Qᵀ`. The other
//! gradients are averaged as [`AllReduceHook`](super::AllReduceHook) does.
//!
//! Ordering: `P`'s all-reduce and the plain all-reduce start at once, when
//! the [`Reducer`](super::Reducer) hands the bucket over; `Q`'s all-reduce
//! needs the summed `P`, so it starts when the bucket's future is first
//! waited on (the Reducer's `finish`, buckets in index order). c10d starts
//! it from a callback instead; here collectives are matched across ranks
//! by the order they are issued, and a callback on a group's thread would
//! race the backward pass's next buckets for that order.

mod linalg;
mod random;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use self::linalg::{mul, mul_a_bt, mul_at_b, orthogonalize};
use self::random::SplitMix64;
use super::comm_hook::all_reduce_mean;
use super::flat_buffer::{read_floats, write_floats, zeros_on};
use super::{CommHook, GradBucket};
use crate::group::{ProcessGroup, ReduceOp, Work, WorkFuture};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// The settings of a [`PowerSgdHook`] (c10d's `PowerSGDState` arguments,
/// with the same defaults).
///
/// ```
/// use tensorcomm::ddp::PowerSgdOptions;
///
/// let options = PowerSgdOptions { matrix_approximation_rank: 2, ..PowerSgdOptions::default() };
/// assert_eq!(options.start_power_sgd_iter, 1_000);
/// assert!(options.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct PowerSgdOptions {
    /// The rank `r` of each compressed matrix's approximation (at least 1;
    /// a matrix of `n × m` uses `min(n, m, r)`).
    pub matrix_approximation_rank: usize,
    /// Iterations averaged by plain all-reduce before compression starts
    /// (c10d's `start_powerSGD_iter`). More than 1 when error feedback or
    /// warm start is on: the Reducer rebuilds its buckets after the first
    /// iteration, and the per-bucket memories must outlive that.
    pub start_power_sgd_iter: u64,
    /// A matrix is compressed only when its uncompressed size exceeds its
    /// compressed size `(n + m) · r` times this rate; the others are
    /// averaged exactly. Finite and not negative.
    pub min_compression_rate: f64,
    /// Add each bucket's last compression error (what this rank's input
    /// minus the result was) to its next input, so that nothing is lost,
    /// only delayed.
    pub use_error_feedback: bool,
    /// Start each iteration's `Q` from the last iteration's instead of
    /// random numbers (one step of power iteration per iteration).
    pub warm_start: bool,
    /// Added to each column's norm before dividing by it in Gram-Schmidt
    /// (0 by default; finite and not negative).
    pub orthogonalization_epsilon: f32,
    /// Seeds the random initial `Q`s: the same on every rank, so every
    /// rank draws the same numbers, and different at every draw.
    pub random_seed: u64,
}

impl Default for PowerSgdOptions {
    fn default() -> Self {
        PowerSgdOptions {
            matrix_approximation_rank: 1,
            start_power_sgd_iter: 1_000,
            min_compression_rate: 2.0,
            use_error_feedback: true,
            warm_start: true,
            orthogonalization_epsilon: 0.0,
            random_seed: 0,
        }
    }
}

impl PowerSgdOptions {
    /// Checks the settings: [`Error::BadValue`] naming the first one out of
    /// range.
    ///
    /// ```
    /// use tensorcomm::ddp::PowerSgdOptions;
    /// use tensorcomm::Error;
    ///
    /// let early = PowerSgdOptions { start_power_sgd_iter: 1, ..PowerSgdOptions::default() };
    /// let e = early.validate().unwrap_err();
    /// assert!(matches!(&e, Error::BadValue { name, .. } if name.contains("start_power_sgd_iter")), "{e}");
    /// let plain = PowerSgdOptions { start_power_sgd_iter: 1, use_error_feedback: false, warm_start: false, ..early };
    /// assert!(plain.validate().is_ok());
    /// ```
    pub fn validate(&self) -> Result<()> {
        let bad = |name: &str, expected: &str, found: String| {
            Err(Error::BadValue {
                name: format!("PowerSGD option {name}"),
                expected: expected.into(),
                found,
            })
        };
        if self.matrix_approximation_rank == 0 {
            return bad("matrix_approximation_rank", "at least 1", "0".into());
        }
        if (self.use_error_feedback || self.warm_start) && self.start_power_sgd_iter <= 1 {
            return bad(
                "start_power_sgd_iter",
                "greater than 1 when use_error_feedback or warm_start is on (the Reducer rebuilds its buckets after the first iteration)",
                self.start_power_sgd_iter.to_string(),
            );
        }
        if !(self.min_compression_rate.is_finite() && self.min_compression_rate >= 0.0) {
            return bad(
                "min_compression_rate",
                "finite and not negative",
                self.min_compression_rate.to_string(),
            );
        }
        let eps = self.orthogonalization_epsilon;
        if !(eps.is_finite() && eps >= 0.0) {
            return bad(
                "orthogonalization_epsilon",
                "finite and not negative",
                eps.to_string(),
            );
        }
        Ok(())
    }
}

/// What a [`PowerSgdHook`] has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PowerSgdStats {
    /// Iterations seen (counted at each iteration's last bucket).
    pub iteration: u64,
    /// Elements of the gradients that went through the compressing path.
    pub numel_before_compression: u64,
    /// Elements actually communicated for them (`P` and `Q`, plus the
    /// gradients left uncompressed).
    pub numel_after_compression: u64,
}

impl PowerSgdStats {
    /// `numel_before_compression / numel_after_compression` (0 before any
    /// compressed iteration).
    pub fn compression_rate(&self) -> f64 {
        if self.numel_after_compression == 0 {
            0.0
        } else {
            self.numel_before_compression as f64 / self.numel_after_compression as f64
        }
    }
}

/// Averages buckets through rank-`r` approximations of their gradients
/// (c10d's `powerSGD_hook`); see the [module docs](self) for the maths.
///
/// For the first `start_power_sgd_iter` iterations it is the plain
/// all-reduce hook. Then each bucket costs three collectives: the
/// uncompressed gradients, `P` and `Q`. With error feedback each rank
/// keeps one bucket-sized error per bucket; with warm start, the `Q`s.
/// `P` and `Q` are computed and communicated in f32 on the host, so the
/// group must take host tensors. One hook (one state) per model: share it
/// between Reducers only if they are the same model.
///
/// The second half of each compressed bucket (orthogonalising P, the Q
/// all-reduce, decompressing) runs when its future is first waited on, so
/// that every rank issues it in the same order (the
/// [`Reducer`](super::Reducer) waits on buckets in index order): a caller
/// driving the hook by hand must wait on every future it gets, in bucket
/// order on every rank; `is_completed` stays false until it does.
///
/// ```
/// use std::sync::Arc;
/// use tensorcomm::ddp::{CommHook, GradBucket, PowerSgdHook, PowerSgdOptions};
/// use tensorcomm::tensor::Tensor;
///
/// let pg = tensorcomm::init_process_group(tensorcomm::Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
/// let hook = PowerSgdHook::new(PowerSgdOptions { start_power_sgd_iter: 2, ..PowerSgdOptions::default() })?;
/// // An 8x8 rank-1 gradient: compressed (16 < 64 / 2) and recovered exactly.
/// let g: Vec<f32> = (0..64).map(|k| ((k / 8) as f32 + 1.0) * ((k % 8) as f32 - 3.5)).collect();
/// for _ in 0..3 {
///     let bucket = GradBucket::new(0, 1, Tensor::from_vec(g.clone(), &[64])?, vec![vec![8, 8]], vec![0])?;
///     let out = hook.run(&pg, bucket)?.wait()?.to_vec::<f32>()?;
///     assert!(out.iter().zip(&g).all(|(a, b)| (a - b).abs() < 1e-4));
/// }
/// let stats = hook.stats();
/// assert_eq!((stats.iteration, stats.numel_before_compression, stats.numel_after_compression), (3, 64, 16));
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct PowerSgdHook {
    options: PowerSgdOptions,
    state: Arc<Mutex<State>>,
}

/// What persists between iterations.
struct State {
    stats: PowerSgdStats,
    rng: SplitMix64,
    /// Per bucket index: this rank's last compression error.
    errors: HashMap<usize, Vec<f64>>,
    /// Per bucket index: the last `Q`s, for warm start.
    qs: HashMap<usize, Vec<f32>>,
}

/// One gradient of a bucket viewed as an `n × m` matrix, compressed to
/// rank `r`.
#[derive(Clone, Copy, Debug)]
struct Compressed {
    offset: usize,
    n: usize,
    m: usize,
    r: usize,
}

impl PowerSgdHook {
    /// A hook with `options`, validated ([`PowerSgdOptions::validate`]).
    pub fn new(options: PowerSgdOptions) -> Result<PowerSgdHook> {
        options.validate()?;
        let state = State {
            stats: PowerSgdStats::default(),
            rng: SplitMix64::new(options.random_seed),
            errors: HashMap::new(),
            qs: HashMap::new(),
        };
        Ok(PowerSgdHook {
            options,
            state: Arc::new(Mutex::new(state)),
        })
    }

    /// The iteration count and compression counters so far.
    pub fn stats(&self) -> PowerSgdStats {
        lock(&self.state).stats
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

const CONTEXT: &str = "PowerSgdHook";

impl CommHook for PowerSgdHook {
    fn run(
        &self,
        group: &Arc<dyn ProcessGroup>,
        bucket: GradBucket,
    ) -> Result<WorkFuture<Tensor<'static>>> {
        let opts = &self.options;
        let mut state = lock(&self.state);
        if state.stats.iteration < opts.start_power_sgd_iter {
            if bucket.is_last() {
                state.stats.iteration += 1;
            }
            drop(state);
            return all_reduce_mean(group, bucket.buffer().clone(), CONTEXT);
        }
        let index = bucket.index();
        let buffer = bucket.buffer().clone();
        let dtype = buffer.dtype();
        let mut input = read_floats(&buffer, CONTEXT)?;
        if opts.use_error_feedback {
            if let Some(error) = state.errors.get(&index) {
                if error.len() != input.len() {
                    return Err(Error::ShapeMismatch {
                        context: format!(
                            "{CONTEXT}: the error kept for bucket {index} (were the buckets changed after start_power_sgd_iter?)"
                        ),
                        expected: vec![input.len()],
                        found: vec![error.len()],
                    });
                }
                input.iter_mut().zip(error).for_each(|(x, e)| *x += e);
                // Round the sum to the bucket's dtype, as an in-place add would.
                write_floats(&buffer, &input, CONTEXT)?;
                input = read_floats(&buffer, CONTEXT)?;
            } else {
                state.errors.insert(index, vec![0.0; input.len()]);
            }
        }

        // Which gradients to compress.
        let mut compressed = Vec::new();
        let mut uncompressed = Vec::new();
        for ((&offset, &len), shape) in bucket
            .offsets()
            .iter()
            .zip(bucket.lengths())
            .zip(bucket.shapes())
        {
            let n = shape.first().copied().unwrap_or(1);
            let m = len.checked_div(n).unwrap_or(0);
            let r = n.min(m).min(opts.matrix_approximation_rank);
            let compressed_size = (n + m) * r;
            state.stats.numel_before_compression += len as u64;
            if r > 0 && (compressed_size as f64) * opts.min_compression_rate < len as f64 {
                compressed.push(Compressed { offset, n, m, r });
                state.stats.numel_after_compression += compressed_size as u64;
            } else {
                uncompressed.push((offset, len));
                state.stats.numel_after_compression += len as u64;
            }
        }

        // The uncompressed gradients: averaged as the all-reduce hook does.
        let plain_len: usize = uncompressed.iter().map(|&(_, len)| len).sum();
        let plain = if plain_len > 0 {
            let flat: Vec<f64> = uncompressed
                .iter()
                .flat_map(|&(offset, len)| input[offset..offset + len].iter().copied())
                .collect();
            let t = zeros_on(plain_len, dtype, buffer.device())?;
            write_floats(&t, &flat, CONTEXT)?;
            Some(all_reduce_mean(group, t, CONTEXT)?)
        } else {
            None
        };

        // The Qs: last iteration's (warm start) or seeded random numbers.
        let q_len: usize = compressed.iter().map(|c| c.m * c.r).sum();
        let mut qs = match state.qs.get(&index) {
            Some(qs) if opts.warm_start && qs.len() == q_len => qs.clone(),
            _ => {
                let seed = state.rng.next_u64();
                SplitMix64::new(seed).normals(q_len)
            }
        };
        let mut ps = Vec::with_capacity(compressed.iter().map(|c| c.n * c.r).sum());
        let mut q_at = 0;
        for c in &compressed {
            let q = &mut qs[q_at..q_at + c.m * c.r];
            orthogonalize(q, c.m, c.r, opts.orthogonalization_epsilon);
            ps.extend(mul(&matrix(&input, c), q, c.n, c.m, c.r));
            q_at += c.m * c.r;
        }
        let p_sum = if compressed.is_empty() {
            None
        } else {
            let p_len = ps.len();
            let p = Tensor::from_vec(ps, &[p_len])?.into_device(buffer.device())?;
            let work = group.all_reduce(&p, ReduceOp::Sum, None)?;
            Some((p, work))
        };
        if bucket.is_last() {
            state.stats.iteration += 1;
        }
        drop(state);

        let job = Finish {
            group: group.clone(),
            state: self.state.clone(),
            options: opts.clone(),
            index,
            buffer,
            input,
            compressed,
            uncompressed,
            plain,
            p_sum,
        };
        Ok(WorkFuture::deferred(move || job.run()))
    }
}

/// The gradient `c` of `input` as a row-major `n × m` f32 matrix.
fn matrix(input: &[f64], c: &Compressed) -> Vec<f32> {
    input[c.offset..c.offset + c.n * c.m]
        .iter()
        .map(|&v| v as f32)
        .collect()
}

/// The second half of a bucket's PowerSGD step, run when its future is
/// waited on.
struct Finish {
    group: Arc<dyn ProcessGroup>,
    state: Arc<Mutex<State>>,
    options: PowerSgdOptions,
    index: usize,
    buffer: Tensor<'static>,
    /// This rank's input (with the error added), as the bucket's dtype
    /// rounds it.
    input: Vec<f64>,
    compressed: Vec<Compressed>,
    uncompressed: Vec<(usize, usize)>,
    plain: Option<WorkFuture<Tensor<'static>>>,
    p_sum: Option<(Tensor<'static>, Work)>,
}

impl Finish {
    fn run(self) -> Result<Tensor<'static>> {
        let mut out = self.input.clone();
        if let Some(plain) = self.plain {
            let averaged = read_floats(&plain.synchronize()?, CONTEXT)?;
            let mut at = 0;
            for &(offset, len) in &self.uncompressed {
                out[offset..offset + len].copy_from_slice(&averaged[at..at + len]);
                at += len;
            }
        }
        if let Some((p, work)) = self.p_sum {
            work.synchronize()?;
            let mut ps = p.to_vec::<f32>()?;
            let mut qs = Vec::new();
            let mut p_at = 0;
            for c in &self.compressed {
                let p = &mut ps[p_at..p_at + c.n * c.r];
                orthogonalize(p, c.n, c.r, self.options.orthogonalization_epsilon);
                qs.extend(mul_at_b(&matrix(&self.input, c), p, c.n, c.m, c.r));
                p_at += c.n * c.r;
            }
            let q_len = qs.len();
            let q = Tensor::from_vec(qs, &[q_len])?.into_device(self.buffer.device())?;
            self.group
                .all_reduce(&q, ReduceOp::Sum, None)?
                .synchronize()?;
            let world = self.group.size() as f32;
            let qs: Vec<f32> = q.to_vec::<f32>()?.into_iter().map(|v| v / world).collect();
            let (mut p_at, mut q_at) = (0, 0);
            for c in &self.compressed {
                let approx = mul_a_bt(
                    &ps[p_at..p_at + c.n * c.r],
                    &qs[q_at..q_at + c.m * c.r],
                    c.n,
                    c.m,
                    c.r,
                );
                for (o, v) in out[c.offset..c.offset + c.n * c.m].iter_mut().zip(approx) {
                    *o = f64::from(v);
                }
                p_at += c.n * c.r;
                q_at += c.m * c.r;
            }
            if self.options.warm_start {
                lock(&self.state).qs.insert(self.index, qs);
            }
        }
        write_floats(&self.buffer, &out, CONTEXT)?;
        if self.options.use_error_feedback {
            let result = read_floats(&self.buffer, CONTEXT)?;
            let error = self.input.iter().zip(&result).map(|(i, r)| i - r).collect();
            lock(&self.state).errors.insert(self.index, error);
        }
        Ok(self.buffer)
    }
}
