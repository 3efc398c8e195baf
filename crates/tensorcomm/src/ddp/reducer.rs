//! `Reducer`: averages gradients over the ranks bucket by bucket while the
//! backward pass is still producing them (c10d's `Reducer`).

mod layout;
mod params_check;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use self::layout::BucketLayout;
use super::flat_buffer::{copy_unless_same, zero_fill};
use super::{CommHook, TensorSpec, DEFAULT_BUCKET_BYTES, DEFAULT_FIRST_BUCKET_BYTES};
use crate::group::{Backend, ProcessGroup, ReduceOp, WorkFuture};
use crate::tensor::{Device, Tensor};
use crate::{Error, Result};

/// How a [`Reducer`] buckets and reports gradients.
#[derive(Clone, Debug)]
pub struct ReducerOptions {
    /// The byte limit of every bucket but the first (DDP's `bucket_cap_mb`).
    pub bucket_cap_bytes: usize,
    /// The byte limit of the first bucket reduced, kept small so that
    /// communication starts early.
    pub first_bucket_bytes: usize,
    /// Allow parameters that get no gradient in an iteration: they are
    /// declared in [`Reducer::prepare_for_backward`] or found missing at
    /// [`Reducer::finish`], reduced as zeros so that buckets complete, and
    /// a parameter no rank used keeps its gradient untouched. Costs one
    /// small all-reduce per iteration and turns off bucket rebuilding.
    pub find_unused_parameters: bool,
    /// Leave the averaged gradients in the buckets (read them through
    /// [`Reducer::gradient`]) instead of copying them back into the
    /// tensors given to [`Reducer::mark_ready`]. With the backward pass
    /// writing each gradient straight into its bucket view (from
    /// [`Reducer::gradient`], fetched before the backward pass, as
    /// PyTorch's `param.grad` is that view), no gradient is copied in or
    /// out.
    pub gradient_as_bucket_view: bool,
    /// How many threads (the caller's included) copy a large host gradient
    /// into its bucket and the average back: a copy of 2 MiB or more is cut
    /// into up to this many parts of at least about 1 MiB, and each such
    /// copy starts that many threads less one for its duration (0 counts
    /// as 1; CUDA gradients copy on the GPU). The default,
    /// [`default_copy_threads`], is this process's share of the host's
    /// cores, at most 4.
    pub copy_threads: usize,
}

/// The host's cores (`std::thread::available_parallelism`) over the
/// processes sharing them (`LOCAL_WORLD_SIZE`, set by `tensorcomm run` and
/// `torchrun`; 1 when unset), between 1 and 4: the default
/// [`ReducerOptions::copy_threads`]. One thread's `memcpy` moves 5-10
/// GB/s; a 25M-parameter model's gradients are 100 MB, copied in and out
/// every step.
///
/// ```
/// let threads = tensorcomm::ddp::default_copy_threads();
/// assert!((1..=4).contains(&threads));
/// ```
pub fn default_copy_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let sharing = std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1);
    (cores / sharing).clamp(1, 4)
}

impl Default for ReducerOptions {
    fn default() -> Self {
        ReducerOptions {
            bucket_cap_bytes: DEFAULT_BUCKET_BYTES,
            first_bucket_bytes: DEFAULT_FIRST_BUCKET_BYTES,
            find_unused_parameters: false,
            gradient_as_bucket_view: false,
            copy_threads: default_copy_threads(),
        }
    }
}

/// Averages gradients over the ranks of a group during the backward pass.
///
/// Parameters are grouped into buckets (one flat buffer each). Call
/// [`mark_ready`](Reducer::mark_ready) as each gradient is produced: the
/// gradient is copied into its bucket, and the moment a bucket's last
/// gradient arrives the bucket's [`CommHook`] starts (buckets start in
/// index order, the same on every rank), so communication overlaps the
/// rest of the backward pass. [`finish`](Reducer::finish) waits for every
/// bucket and writes the averaged gradients back.
///
/// The first buckets assume gradients arrive in reverse parameter order
/// (the reverse of a forward pass); after the first iteration they are
/// rebuilt in the order rank 0's gradients actually arrived. Every rank
/// must build its Reducer from the same parameters (checked at
/// construction) and start from the same parameter values (see
/// [`broadcast_coalesced`](super::broadcast_coalesced)).
///
/// Gradients may be host or CUDA tensors (each bucket lives on its
/// parameters' device). Over a NCCL group, which takes only CUDA tensors,
/// the Reducer's own small messages (the parameter check, the bucket
/// order, the used-parameter mask) go on the first parameter's GPU; over
/// any other group they stay on the host.
///
/// ```
/// use std::sync::Arc;
/// use tensorcomm::ddp::{AllReduceHook, Reducer, ReducerOptions, TensorSpec};
/// use tensorcomm::tensor::{DType, Tensor};
///
/// let pg = tensorcomm::init_process_group(tensorcomm::Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
/// let params = vec![TensorSpec::new(&[2, 2], DType::F32), TensorSpec::new(&[2], DType::F32)];
/// let mut reducer = Reducer::new(pg, params, Arc::new(AllReduceHook), ReducerOptions::default())?;
/// let (w, b) = (Tensor::from_vec(vec![1.0f32; 4], &[2, 2])?, Tensor::from_vec(vec![2.0f32; 2], &[2])?);
/// reducer.mark_ready(1, &b)?; // backward produces the last parameter's gradient first
/// reducer.mark_ready(0, &w)?;
/// reducer.finish()?;
/// assert_eq!(w.to_vec::<f32>()?, [1.0; 4]); // the mean over one rank
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct Reducer {
    group: Arc<dyn ProcessGroup>,
    params: Vec<TensorSpec>,
    hook: Arc<dyn CommHook>,
    options: ReducerOptions,
    layout: BucketLayout,
    /// Iterations finished so far.
    finished: u64,
    /// The iteration in progress, if any.
    current: Option<Iteration>,
    rebuilt: bool,
    /// Parameters no rank used in the last finished iteration.
    globally_unused: Vec<usize>,
}

/// One iteration's progress.
struct Iteration {
    /// Whether each parameter's gradient (or unused mark) arrived.
    arrived: Vec<bool>,
    /// Whether this rank produced each parameter's gradient.
    used: Vec<bool>,
    /// The tensors to write averaged gradients back into.
    grads: Vec<Option<Tensor<'static>>>,
    /// Gradients each bucket still waits for.
    pending: Vec<usize>,
    /// The next bucket to start (buckets start in index order).
    next_bucket: usize,
    /// Each started bucket's hook future, or the error starting it.
    launched: Vec<Result<WorkFuture<Tensor<'static>>>>,
    /// Parameters in the order their gradients arrived.
    arrival: Vec<usize>,
}

impl Reducer {
    /// A reducer for parameters `params` (in model order) over `group`,
    /// communicating each bucket with `hook`. Every rank of `group` calls
    /// it with the same parameters: they are compared through an
    /// all-gather, and a difference fails on every rank with
    /// [`Error::ParamsMismatch`].
    pub fn new(
        group: Arc<dyn ProcessGroup>,
        params: Vec<TensorSpec>,
        hook: Arc<dyn CommHook>,
        options: ReducerOptions,
    ) -> Result<Reducer> {
        if params.is_empty() {
            return Err(Error::InvalidArgument(
                "Reducer::new: expected at least one parameter, found none".into(),
            ));
        }
        if let Some((i, p)) = params
            .iter()
            .enumerate()
            .find(|(_, p)| !p.dtype.is_floating_point())
        {
            return Err(Error::InvalidArgument(format!(
                "Reducer::new: expected floating-point parameters, found parameter {i} of {p}"
            )));
        }
        params_check::check_same_params(&group, &params, control_device(&group, &params))?;
        let reverse: Vec<usize> = (0..params.len()).rev().collect();
        let layout = BucketLayout::new(
            &params,
            &reverse,
            options.first_bucket_bytes,
            options.bucket_cap_bytes,
        )?;
        Ok(Reducer {
            group,
            params,
            hook,
            options,
            layout,
            finished: 0,
            current: None,
            rebuilt: false,
            globally_unused: Vec::new(),
        })
    }

    /// The parameter indices of each bucket, in the order buckets are
    /// reduced.
    pub fn bucket_indices(&self) -> Vec<Vec<usize>> {
        self.layout
            .buckets
            .iter()
            .map(|b| b.params.clone())
            .collect()
    }

    /// Parameter `param`'s gradient slot: a view into its bucket. After
    /// [`finish`](Reducer::finish) it holds the averaged gradient.
    ///
    /// A backward pass may write the gradient straight into it: given to
    /// [`mark_ready`](Reducer::mark_ready), the view is not copied (it is
    /// its bucket slot already), and with
    /// [`gradient_as_bucket_view`](ReducerOptions::gradient_as_bucket_view)
    /// [`finish`](Reducer::finish) copies nothing back either (as PyTorch
    /// DDP's `gradient_as_bucket_view=True`, where `param.grad` is the
    /// view). Fetch the views before every backward pass: the first
    /// `finish()` rebuilds the buckets in arrival order (new buffers; the
    /// old views still hold that iteration's averages, but a gradient
    /// written into one later would be copied in and its average left in
    /// the new bucket only).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tensorcomm::ddp::{AllReduceHook, Reducer, ReducerOptions, TensorSpec};
    /// use tensorcomm::tensor::{DType, Tensor};
    ///
    /// let pg = tensorcomm::init_process_group(tensorcomm::Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
    /// let params = vec![TensorSpec::new(&[2, 2], DType::F32), TensorSpec::new(&[2], DType::F32)];
    /// let options = ReducerOptions { gradient_as_bucket_view: true, ..ReducerOptions::default() };
    /// let mut reducer = Reducer::new(pg, params, Arc::new(AllReduceHook), options)?;
    /// for step in 0..3 {
    ///     // Before the backward pass: where each gradient goes.
    ///     let (w, b) = (reducer.gradient(0)?, reducer.gradient(1)?);
    ///     b.fill(step as f32)?; // the backward pass writes the bias's gradient...
    ///     reducer.mark_ready(1, &b)?; // ...and hands it over: no copy
    ///     w.fill(1.0f32)?;
    ///     reducer.mark_ready(0, &w)?;
    ///     reducer.finish()?; // no copy back: the views hold the means
    ///     assert_eq!(b.to_vec::<f32>()?, [step as f32; 2]);
    ///     assert_eq!(w.to_vec::<f32>()?, [1.0; 4]);
    /// }
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn gradient(&self, param: usize) -> Result<Tensor<'static>> {
        self.check_index(param, "gradient")?;
        self.layout.view(&self.params, param)
    }

    /// Parameters that no rank used in the last finished iteration (with
    /// `find_unused_parameters`); their gradients were left untouched.
    pub fn globally_unused(&self) -> &[usize] {
        &self.globally_unused
    }

    /// Starts an iteration, declaring the parameters this rank will not
    /// produce a gradient for (only with `find_unused_parameters`): they
    /// count as zeros at once, so their buckets can start. Optional when
    /// nothing is unused: the first [`mark_ready`](Reducer::mark_ready)
    /// starts an iteration. An error if the last iteration has not
    /// finished, naming the parameters whose gradients never arrived.
    pub fn prepare_for_backward(&mut self, unused: &[usize]) -> Result<()> {
        if let Some(current) = &self.current {
            let missing = missing(&current.arrived);
            return Err(self.misuse(
                "finish() of this iteration before a new one starts".into(),
                if missing.is_empty() {
                    "a new iteration started before finish() (every gradient had arrived)".into()
                } else {
                    format!(
                        "a new iteration started while parameters {missing:?} never got a gradient"
                    )
                },
            ));
        }
        if !unused.is_empty() && !self.options.find_unused_parameters {
            return Err(self.misuse(
                "find_unused_parameters=true to declare unused parameters".into(),
                format!("parameters {unused:?} declared unused"),
            ));
        }
        for &p in unused {
            self.check_index(p, "prepare_for_backward")?;
        }
        let n = self.params.len();
        let buckets = self.layout.buckets.len();
        self.current = Some(Iteration {
            arrived: vec![false; n],
            used: vec![false; n],
            grads: vec![None; n],
            pending: self.layout.buckets.iter().map(|b| b.params.len()).collect(),
            next_bucket: 0,
            launched: Vec::with_capacity(buckets),
            arrival: Vec::with_capacity(n),
        });
        let mut unique = unused.to_vec();
        unique.sort_unstable();
        unique.dedup();
        for p in unique {
            self.arrive(p, None)?;
        }
        Ok(())
    }

    /// Records parameter `param`'s gradient for this iteration: copies it
    /// into its bucket (unless it is its bucket view, from
    /// [`gradient`](Reducer::gradient)) and, if that completes the next
    /// buckets in order, starts their hooks. Starts an iteration if none
    /// is in progress. An error if the gradient was already marked in this
    /// iteration, or does not match the parameter's shape and dtype.
    pub fn mark_ready(&mut self, param: usize, grad: &Tensor<'static>) -> Result<()> {
        self.check_index(param, "mark_ready")?;
        let spec = &self.params[param];
        if grad.shape() != spec.shape.as_slice() {
            return Err(Error::ShapeMismatch {
                context: format!("Reducer::mark_ready: the gradient of parameter {param}"),
                expected: spec.shape.clone(),
                found: grad.shape().to_vec(),
            });
        }
        if grad.dtype() != spec.dtype {
            return Err(Error::DTypeMismatch {
                context: format!("Reducer::mark_ready: the gradient of parameter {param}"),
                expected: spec.dtype,
                found: grad.dtype(),
            });
        }
        if self.current.is_none() {
            self.prepare_for_backward(&[])?;
        }
        self.arrive(param, Some(grad))
    }

    /// Marks `param` arrived with `grad`, or as unused (zeros) with `None`,
    /// and starts every bucket that is now complete and next in order.
    fn arrive(&mut self, param: usize, grad: Option<&Tensor<'static>>) -> Result<()> {
        let already = self.current.as_ref().is_some_and(|c| c.arrived[param]);
        if already {
            return Err(self.misuse(
                "each parameter's gradient marked ready once per iteration".into(),
                format!("parameter {param} marked ready a second time"),
            ));
        }
        let slot = self.layout.view(&self.params, param)?;
        match grad {
            Some(grad) => copy_unless_same(&slot, grad, self.options.copy_threads)?,
            None => zero_fill(&slot)?,
        }
        let keep = !self.options.gradient_as_bucket_view;
        let bucket = self.layout.bucket_of(param);
        let Some(current) = self.current.as_mut() else {
            return Ok(());
        };
        current.arrived[param] = true;
        if let Some(grad) = grad {
            current.used[param] = true;
            current.arrival.push(param);
            if keep {
                current.grads[param] = Some(grad.clone());
            }
        }
        current.pending[bucket] -= 1;
        self.launch_ready_buckets()
    }

    /// Starts the hooks of the buckets that are complete, in index order,
    /// stopping at the first incomplete one.
    fn launch_ready_buckets(&mut self) -> Result<()> {
        let mut first_error = None;
        while let Some(current) = self.current.as_ref() {
            let b = current.next_bucket;
            if b >= current.pending.len() || current.pending[b] > 0 {
                break;
            }
            let started = self
                .layout
                .grad_bucket(&self.params, b)
                .and_then(|bucket| self.hook.run(&self.group, bucket));
            if let Err(e) = &started {
                first_error.get_or_insert_with(|| e.clone());
            }
            if let Some(current) = self.current.as_mut() {
                current.launched.push(started);
                current.next_bucket += 1;
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Waits for every bucket, writes the averaged gradients back (into
    /// the tensors given to [`mark_ready`](Reducer::mark_ready) that are
    /// not their bucket views, unless `gradient_as_bucket_view`), and ends
    /// the iteration. After the first
    /// iteration, rebuilds the buckets in the order gradients arrived on
    /// rank 0 (not with `find_unused_parameters`).
    ///
    /// Buckets are waited for in index order, and each bucket's averages
    /// are written back once it and the buckets before it are done, while
    /// the later buckets' communication goes on (as PyTorch DDP finalizes
    /// bucket by bucket).
    ///
    /// Fails, leaving the iteration open so the missing gradients can still
    /// be marked, when a gradient never arrived (without
    /// `find_unused_parameters`); fails with the first hook's error when a
    /// bucket's communication failed. The iteration then ends; of the
    /// tensors given to `mark_ready` that are not bucket views, those of
    /// the buckets before the failed one hold their averages (as in
    /// PyTorch DDP), those of that bucket and later ones are left as they
    /// were. Bucket buffers (and so gradients that are bucket views) hold
    /// whatever each bucket's hook left there.
    pub fn finish(&mut self) -> Result<()> {
        let Some(current) = self.current.as_ref() else {
            return Err(self.misuse(
                "mark_ready or prepare_for_backward before finish()".into(),
                "finish() with no iteration in progress".into(),
            ));
        };
        let missing = missing(&current.arrived);
        if !missing.is_empty() {
            if !self.options.find_unused_parameters {
                return Err(self.misuse(
                    format!("gradients of all {} parameters before finish()", self.params.len()),
                    format!(
                        "parameters {missing:?} never got a gradient (set find_unused_parameters if some parameters are unused)"
                    ),
                ));
            }
            for p in missing {
                self.arrive(p, None)?;
            }
        }
        let Some(current) = self.current.take() else {
            return Ok(());
        };
        let outcome = self.complete(current);
        self.finished += 1;
        outcome
    }

    /// Waits for the hooks, agrees on unused parameters, writes back, and
    /// rebuilds the buckets after the first iteration.
    fn complete(&mut self, current: Iteration) -> Result<()> {
        // A bucket is written back once it and the ones before it are done
        // (see `finish`). Only gradients this rank produced are written
        // back, and those parameters are used globally whatever the other
        // ranks say, so this needs no agreement on unused parameters.
        let mut first_error = None;
        for (b, started) in current.launched.into_iter().enumerate() {
            // `synchronize`: the write-back below copies on the device's
            // own stream, which is not ordered after the hook's collective.
            let result = started.and_then(|future| future.synchronize());
            let mut result = result.and_then(|reduced| self.take_result(b, &reduced));
            if first_error.is_none() {
                result = result.and_then(|()| {
                    let bucket = &self.layout.buckets[b].params;
                    self.write_back(&current.grads, bucket.iter().copied())
                });
            }
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        let globally_used = if self.options.find_unused_parameters {
            self.agree_on_used(&current.used)?
        } else {
            vec![true; self.params.len()]
        };
        self.globally_unused = (0..self.params.len())
            .filter(|&p| !globally_used[p])
            .collect();
        if !self.rebuilt && !self.options.find_unused_parameters {
            self.rebuild(&current.arrival)?;
        }
        Ok(())
    }

    /// Copies the averages of `params` from their bucket slots into the
    /// tensors their gradients came in (`grads`: none where that is the
    /// bucket view).
    fn write_back(
        &self,
        grads: &[Option<Tensor<'static>>],
        params: impl Iterator<Item = usize>,
    ) -> Result<()> {
        for p in params {
            if let Some(grad) = &grads[p] {
                let average = self.layout.view(&self.params, p)?;
                copy_unless_same(grad, &average, self.options.copy_threads)?;
            }
        }
        Ok(())
    }

    /// Copies a hook's result for bucket `b` into the bucket's buffer
    /// (unless it is that buffer).
    fn take_result(&self, b: usize, reduced: &Tensor<'static>) -> Result<()> {
        let buffer = &self.layout.buckets[b].buffer;
        if reduced.shape() != buffer.shape() {
            return Err(Error::ShapeMismatch {
                context: format!("the communication hook's result for bucket {b}"),
                expected: buffer.shape().to_vec(),
                found: reduced.shape().to_vec(),
            });
        }
        if reduced.dtype() != buffer.dtype() {
            return Err(Error::DTypeMismatch {
                context: format!("the communication hook's result for bucket {b}"),
                expected: buffer.dtype(),
                found: reduced.dtype(),
            });
        }
        if reduced.shares_storage(buffer) && reduced.layout() == buffer.layout() {
            // The hook reduced the bucket in place (a GPU copy onto itself
            // would be an overlapping copy).
            return Ok(());
        }
        buffer
            .copy_from_split(reduced, self.options.copy_threads)
            .map(|_| ())
    }

    /// Sums every rank's used-mask: a parameter is globally used when some
    /// rank produced its gradient.
    fn agree_on_used(&self, used: &[bool]) -> Result<Vec<bool>> {
        let mask: Vec<i32> = used.iter().map(|&u| i32::from(u)).collect();
        let mask = Tensor::from_vec(mask, &[used.len()])?
            .into_device(control_device(&self.group, &self.params))?;
        self.group
            .all_reduce(&mask, ReduceOp::Sum, None)?
            .synchronize()?;
        Ok(mask.to_vec::<i32>()?.into_iter().map(|c| c > 0).collect())
    }

    /// Rebuilds the buckets in rank 0's arrival order (broadcast, so every
    /// rank builds the same buckets), carrying the gradients over.
    fn rebuild(&mut self, arrival: &[usize]) -> Result<()> {
        let order: Vec<i64> = arrival.iter().map(|&p| p as i64).collect();
        let order = Tensor::from_vec(order, &[arrival.len()])?
            .into_device(control_device(&self.group, &self.params))?;
        self.group.broadcast(&order, 0, None)?.synchronize()?;
        let order: Vec<usize> = order
            .to_vec::<i64>()?
            .into_iter()
            .map(|p| p as usize)
            .collect();
        let layout = BucketLayout::new(
            &self.params,
            &order,
            self.options.first_bucket_bytes,
            self.options.bucket_cap_bytes,
        )?;
        // Keep this iteration's averaged gradients readable through
        // `gradient` (they are the gradients with gradient_as_bucket_view).
        for p in 0..self.params.len() {
            layout
                .view(&self.params, p)?
                .copy_from(&self.layout.view(&self.params, p)?)?;
        }
        self.layout = layout;
        self.rebuilt = true;
        Ok(())
    }

    fn check_index(&self, param: usize, op: &str) -> Result<()> {
        if param >= self.params.len() {
            return Err(Error::InvalidArgument(format!(
                "Reducer::{op}: expected a parameter index in 0..{}, found {param}",
                self.params.len()
            )));
        }
        Ok(())
    }

    fn misuse(&self, expected: String, found: String) -> Error {
        Error::ReducerMisuse {
            iteration: self.finished,
            expected,
            found,
        }
    }
}

/// Where the Reducer's own messages go: the first parameter's device over
/// a NCCL group (which refuses host tensors), the host over any other.
fn control_device(group: &Arc<dyn ProcessGroup>, params: &[TensorSpec]) -> Device {
    match (group.backend(), params.first()) {
        (Backend::Nccl, Some(first)) => first.device,
        _ => Device::Cpu,
    }
}

/// The parameters whose gradient has not arrived.
fn missing(arrived: &[bool]) -> Vec<usize> {
    (0..arrived.len()).filter(|&p| !arrived[p]).collect()
}
