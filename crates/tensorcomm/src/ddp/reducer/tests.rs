//! The Reducer on one rank: overlap order, rebuilding, unused parameters
//! and every misuse error.

use std::sync::{Arc, Mutex};

use super::*;
use crate::cpu::backend::{CpuOptions, ProcessGroupCpu};
use crate::ddp::{AllReduceHook, GradBucket, NoOpHook};
use crate::store::HashStore;
use crate::tensor::DType;

fn single_rank() -> Arc<dyn ProcessGroup> {
    let store = Arc::new(HashStore::new());
    Arc::new(ProcessGroupCpu::new(store, "ddp", 0, 1, &CpuOptions::default()).unwrap())
}

/// Logs each bucket it starts into a shared log, then hands it back.
struct RecordingHook(Arc<Mutex<Vec<String>>>);

impl CommHook for RecordingHook {
    fn run(
        &self,
        _: &Arc<dyn ProcessGroup>,
        bucket: GradBucket,
    ) -> Result<WorkFuture<Tensor<'static>>> {
        let entry = format!("bucket {} {:?}", bucket.index(), bucket.parameter_indices());
        self.0.lock().unwrap().push(entry);
        Ok(WorkFuture::ready(bucket.buffer().clone()))
    }
}

/// Four f32 parameters of 4 elements (16 bytes); buckets of 32 bytes.
fn four_params(options: ReducerOptions, hook: Arc<dyn CommHook>) -> Reducer {
    let params = vec![TensorSpec::new(&[4], DType::F32); 4];
    Reducer::new(single_rank(), params, hook, options).unwrap()
}

fn small_buckets() -> ReducerOptions {
    ReducerOptions {
        bucket_cap_bytes: 32,
        first_bucket_bytes: 32,
        ..ReducerOptions::default()
    }
}

fn grad(value: f32) -> Tensor<'static> {
    Tensor::from_vec(vec![value; 4], &[4]).unwrap()
}

#[test]
fn a_bucket_starts_before_later_gradients_arrive() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut reducer = four_params(small_buckets(), Arc::new(RecordingHook(log.clone())));
    assert_eq!(reducer.bucket_indices(), [vec![3, 2], vec![1, 0]]);
    for p in (0..4).rev() {
        log.lock().unwrap().push(format!("grad {p}"));
        reducer.mark_ready(p, &grad(p as f32)).unwrap();
    }
    reducer.finish().unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        [
            "grad 3",
            "grad 2",
            "bucket 0 [3, 2]",
            "grad 1",
            "grad 0",
            "bucket 1 [1, 0]"
        ]
    );
}

#[test]
fn buckets_start_in_index_order_even_when_a_later_one_completes_first() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut reducer = four_params(small_buckets(), Arc::new(RecordingHook(log.clone())));
    for p in [0, 1, 3, 2] {
        log.lock().unwrap().push(format!("grad {p}"));
        reducer.mark_ready(p, &grad(1.0)).unwrap();
    }
    assert_eq!(
        *log.lock().unwrap(),
        [
            "grad 0",
            "grad 1",
            "grad 3",
            "grad 2",
            "bucket 0 [3, 2]",
            "bucket 1 [1, 0]"
        ]
    );
    reducer.finish().unwrap();
}

#[test]
fn buckets_are_rebuilt_in_arrival_order_after_the_first_iteration() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut reducer = four_params(small_buckets(), Arc::new(RecordingHook(log.clone())));
    for p in [0, 2, 1, 3] {
        reducer.mark_ready(p, &grad(1.0)).unwrap();
    }
    reducer.finish().unwrap();
    assert_eq!(reducer.bucket_indices(), [vec![0, 2], vec![1, 3]]);
    log.lock().unwrap().clear();
    for p in [0, 2, 1, 3] {
        reducer.mark_ready(p, &grad(1.0)).unwrap();
    }
    reducer.finish().unwrap();
    assert_eq!(*log.lock().unwrap(), ["bucket 0 [0, 2]", "bucket 1 [1, 3]"]);
    // Only once: a different order in iteration 2 keeps the buckets.
    for p in [3, 2, 1, 0] {
        reducer.mark_ready(p, &grad(1.0)).unwrap();
    }
    reducer.finish().unwrap();
    assert_eq!(reducer.bucket_indices(), [vec![0, 2], vec![1, 3]]);
}

#[test]
fn averaged_gradients_are_written_back_or_left_as_bucket_views() {
    let grads: Vec<_> = (0..4).map(|p| grad(p as f32 + 0.5)).collect();
    let mut reducer = four_params(small_buckets(), Arc::new(AllReduceHook));
    for p in (0..4).rev() {
        reducer.mark_ready(p, &grads[p]).unwrap();
    }
    reducer.finish().unwrap();
    for (p, g) in grads.iter().enumerate() {
        assert_eq!(g.to_vec::<f32>().unwrap(), [p as f32 + 0.5; 4]);
        assert_eq!(
            reducer.gradient(p).unwrap().to_vec::<f32>().unwrap(),
            [p as f32 + 0.5; 4]
        );
    }

    let options = ReducerOptions {
        gradient_as_bucket_view: true,
        ..small_buckets()
    };
    let mut reducer = four_params(options, Arc::new(AllReduceHook));
    for p in (0..4).rev() {
        reducer.mark_ready(p, &grad(7.0)).unwrap();
    }
    reducer.finish().unwrap();
    let view = reducer.gradient(1).unwrap();
    assert_eq!(view.to_vec::<f32>().unwrap(), [7.0; 4]);
    assert!(view.shares_storage(&reducer.layout.buckets[reducer.layout.bucket_of(1)].buffer));
}

#[test]
fn unused_parameters_complete_their_buckets() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let options = ReducerOptions {
        find_unused_parameters: true,
        ..small_buckets()
    };
    let mut reducer = four_params(options, Arc::new(RecordingHook(log.clone())));
    // Parameter 2 is declared unused: bucket 0 [3, 2] starts with 3 alone.
    reducer.prepare_for_backward(&[2]).unwrap();
    reducer.mark_ready(3, &grad(3.0)).unwrap();
    assert_eq!(*log.lock().unwrap(), ["bucket 0 [3, 2]"]);
    reducer.mark_ready(1, &grad(1.0)).unwrap();
    // Parameter 0 never arrives: finish counts it as unused.
    reducer.finish().unwrap();
    assert_eq!(reducer.globally_unused(), [0, 2]);
    assert_eq!(
        reducer.gradient(2).unwrap().to_vec::<f32>().unwrap(),
        [0.0; 4]
    );
    // No rebuild with find_unused_parameters.
    assert_eq!(reducer.bucket_indices(), [vec![3, 2], vec![1, 0]]);
}

#[test]
fn misuse_is_reported_with_what_was_expected() {
    let mut reducer = four_params(small_buckets(), Arc::new(NoOpHook));
    let e = reducer.finish().unwrap_err();
    assert!(e.to_string().contains("no iteration in progress"), "{e}");

    reducer.mark_ready(3, &grad(1.0)).unwrap();
    let e = reducer.mark_ready(3, &grad(1.0)).unwrap_err();
    assert!(
        matches!(e, Error::ReducerMisuse { iteration: 0, .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("parameter 3 marked ready a second time"),
        "{e}"
    );

    let e = reducer.finish().unwrap_err();
    assert!(
        e.to_string()
            .contains("gradients of all 4 parameters before finish()"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("parameters [0, 1, 2] never got a gradient"),
        "{e}"
    );

    let e = reducer.prepare_for_backward(&[]).unwrap_err();
    assert!(
        e.to_string()
            .contains("finish() of this iteration before a new one starts"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("parameters [0, 1, 2] never got a gradient"),
        "{e}"
    );

    let e = reducer.mark_ready(4, &grad(1.0)).unwrap_err();
    assert!(
        e.to_string().contains("parameter index in 0..4, found 4"),
        "{e}"
    );
    let e = reducer
        .mark_ready(2, &Tensor::zeros(&[5], DType::F32).unwrap())
        .unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    let e = reducer
        .mark_ready(2, &Tensor::zeros(&[4], DType::F64).unwrap())
        .unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { .. }), "{e}");

    // The open iteration can still be completed after the errors.
    for p in [2, 1, 0] {
        reducer.mark_ready(p, &grad(1.0)).unwrap();
    }
    reducer.finish().unwrap();
    let e = reducer.prepare_for_backward(&[1]).unwrap_err();
    assert!(e.to_string().contains("find_unused_parameters=true"), "{e}");
    assert!(
        matches!(e, Error::ReducerMisuse { iteration: 1, .. }),
        "{e}"
    );
}

/// A hook whose communication fails.
struct FailingHook;

impl CommHook for FailingHook {
    fn run(
        &self,
        _: &Arc<dyn ProcessGroup>,
        bucket: GradBucket,
    ) -> Result<WorkFuture<Tensor<'static>>> {
        lost(&bucket)
    }
}

/// A future that fails, saying `bucket` was lost.
fn lost(bucket: &GradBucket) -> Result<WorkFuture<Tensor<'static>>> {
    let index = bucket.index();
    Ok(WorkFuture::ready(())
        .then(move |_| Err(Error::InvalidArgument(format!("bucket {index} lost")))))
}

#[test]
fn hook_failures_and_bad_results_surface_in_finish() {
    let original = grad(5.0);
    let mut reducer = four_params(small_buckets(), Arc::new(FailingHook));
    for p in (0..4).rev() {
        reducer.mark_ready(p, &original).unwrap();
    }
    let e = reducer.finish().unwrap_err();
    assert!(e.to_string().contains("bucket 0 lost"), "{e}");
    assert_eq!(original.to_vec::<f32>().unwrap(), [5.0; 4]);

    struct WrongSize;
    impl CommHook for WrongSize {
        fn run(
            &self,
            _: &Arc<dyn ProcessGroup>,
            _: GradBucket,
        ) -> Result<WorkFuture<Tensor<'static>>> {
            Ok(WorkFuture::ready(Tensor::zeros(&[3], DType::F32)?))
        }
    }
    let mut reducer = four_params(small_buckets(), Arc::new(WrongSize));
    for p in (0..4).rev() {
        reducer.mark_ready(p, &original).unwrap();
    }
    let e = reducer.finish().unwrap_err();
    assert!(
        e.to_string()
            .contains("communication hook's result for bucket 0"),
        "{e}"
    );
}

/// A ready future holding a new buffer of twice `bucket`'s values.
fn doubled(bucket: &GradBucket) -> Result<WorkFuture<Tensor<'static>>> {
    let values: Vec<f32> = bucket
        .buffer()
        .to_vec::<f32>()?
        .iter()
        .map(|v| 2.0 * v)
        .collect();
    let n = values.len();
    Ok(WorkFuture::ready(Tensor::from_vec(values, &[n])?))
}

/// Doubles bucket 0 and fails every later bucket.
struct FirstBucketOnly;

impl CommHook for FirstBucketOnly {
    fn run(
        &self,
        _: &Arc<dyn ProcessGroup>,
        bucket: GradBucket,
    ) -> Result<WorkFuture<Tensor<'static>>> {
        if bucket.index() > 0 {
            return lost(&bucket);
        }
        doubled(&bucket)
    }
}

#[test]
fn a_failed_bucket_leaves_its_gradients_and_later_ones_as_they_were() {
    // Buckets [3, 2] and [1, 0]: the first is written back before the
    // second fails, with or without find_unused_parameters.
    for find_unused_parameters in [false, true] {
        let grads: Vec<Tensor<'static>> = (0..4).map(|p| grad(p as f32 + 1.0)).collect();
        let options = ReducerOptions {
            find_unused_parameters,
            ..small_buckets()
        };
        let mut reducer = four_params(options, Arc::new(FirstBucketOnly));
        assert_eq!(reducer.bucket_indices(), [vec![3, 2], vec![1, 0]]);
        reducer.prepare_for_backward(&[]).unwrap();
        for p in (0..4).rev() {
            reducer.mark_ready(p, &grads[p]).unwrap();
        }
        let e = reducer.finish().unwrap_err();
        assert!(e.to_string().contains("bucket 1 lost"), "{e}");
        let values: Vec<Vec<f32>> = grads.iter().map(|g| g.to_vec::<f32>().unwrap()).collect();
        assert_eq!(
            values,
            [[1.0; 4], [2.0; 4], [6.0; 4], [8.0; 4]],
            "find_unused_parameters {find_unused_parameters}"
        );
    }
}

/// The value the test below gives element `i` of parameter `p`'s
/// gradient at `step`.
fn ramp_value(p: usize, i: usize, step: usize) -> f32 {
    (i + 7 * p + step) as f32
}

/// Checks that every gradient arrived whole in its bucket slot, then hands
/// back a new buffer holding twice the bucket's values.
struct DoublingHook {
    step: std::sync::atomic::AtomicUsize,
}

impl CommHook for DoublingHook {
    fn run(
        &self,
        _: &Arc<dyn ProcessGroup>,
        bucket: GradBucket,
    ) -> Result<WorkFuture<Tensor<'static>>> {
        let step = self.step.load(std::sync::atomic::Ordering::Relaxed);
        for (&p, slot) in bucket.parameter_indices().iter().zip(bucket.gradients()?) {
            let got = slot.to_vec::<f32>()?;
            let wrong = (0..got.len()).find(|&i| got[i] != ramp_value(p, i, step));
            assert!(wrong.is_none(), "parameter {p}'s slot differs at {wrong:?}");
        }
        doubled(&bucket)
    }
}

#[test]
fn large_gradients_copied_on_several_threads_arrive_whole_and_come_back_in_place() {
    // Two 3 MiB gradients (split into parts when copied) around a small
    // one, every element distinct, checked in the buckets and after the
    // copy back, so a part copied to the wrong place or not at all shows.
    let big = 3 << 18;
    let params = vec![
        TensorSpec::new(&[big], DType::F32),
        TensorSpec::new(&[5], DType::F32),
        TensorSpec::new(&[big / 2, 2], DType::F32),
    ];
    for threads in [0, 1, 3, 8] {
        let options = ReducerOptions {
            copy_threads: threads,
            ..ReducerOptions::default()
        };
        let hook = Arc::new(DoublingHook {
            step: Default::default(),
        });
        let mut reducer =
            Reducer::new(single_rank(), params.clone(), hook.clone(), options).unwrap();
        for step in 0..2 {
            hook.step.store(step, std::sync::atomic::Ordering::Relaxed);
            let ramp = |p: usize, n: usize| -> Vec<f32> {
                (0..n).map(|i| ramp_value(p, i, step)).collect()
            };
            let grads = [
                Tensor::from_vec(ramp(0, big), &[big]).unwrap(),
                Tensor::from_vec(ramp(1, 5), &[5]).unwrap(),
                Tensor::from_vec(ramp(2, big), &[big / 2, 2]).unwrap(),
            ];
            for p in (0..3).rev() {
                reducer.mark_ready(p, &grads[p]).unwrap();
            }
            reducer.finish().unwrap();
            for (p, g) in grads.iter().enumerate() {
                let want: Vec<f32> = ramp(p, g.numel()).into_iter().map(|v| 2.0 * v).collect();
                assert!(
                    g.to_vec::<f32>().unwrap() == want,
                    "threads {threads}, step {step}: parameter {p}'s gradient is not twice its input"
                );
            }
        }
    }
}
