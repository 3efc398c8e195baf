//! `cuda::comm` with sparse tensors on two GPUs: reduce_add's sparse sum,
//! broadcast_coalesced of dense and sparse tensors in one list, and sparse
//! tensors with GPU values. Each test prints a line and returns when the
//! machine has no CUDA driver or fewer than two GPUs.
#![cfg(feature = "cuda")]

mod skip;

use tensorcomm::cuda::comm::{self, CommTensor, DEFAULT_BUFFER_SIZE};
use tensorcomm::cuda::runtime;
use tensorcomm::tensor::{DType, Device, SparseTensor, Tensor};
use tensorcomm::Error;

fn two_gpus(test: &str) -> bool {
    match runtime::device_count() {
        Ok(n) if n >= 2 => true,
        Ok(n) => {
            skip::skipped(test, format!("needs 2 GPUs, found {n}"));
            false
        }
        Err(e) => {
            skip::skipped(test, e);
            false
        }
    }
}

/// A [6, 3] tensor with one sparse dimension: rows `rows` (repeats allowed)
/// holding `seed`-dependent values.
fn rows(rows: &[i64], seed: f32, device: usize) -> SparseTensor {
    let values: Vec<f32> = (0..rows.len() * 3).map(|i| seed + i as f32).collect();
    let values = Tensor::from_vec(values, &[rows.len(), 3]).unwrap();
    SparseTensor::new(rows.to_vec(), values, &[6, 3])
        .unwrap()
        .to_device(Device::Cuda(device))
        .unwrap()
}

fn dense_host(s: &SparseTensor) -> Vec<f32> {
    s.to_dense()
        .unwrap()
        .to_device(Device::Cpu)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

#[test]
fn sparse_tensors_with_gpu_values_coalesce_and_densify_on_their_device() {
    if !two_gpus("sparse_tensors_with_gpu_values_coalesce_and_densify_on_their_device") {
        return;
    }
    let s = rows(&[4, 1, 4], 1.0, 1);
    assert_eq!(s.device(), Device::Cuda(1));
    let c = s.coalesce().unwrap();
    assert_eq!(c.device(), Device::Cuda(1));
    assert_eq!(c.indices(), &[1, 4]);
    assert_eq!(
        c.values().to_vec::<f32>().unwrap(),
        [4.0, 5.0, 6.0, 1.0 + 7.0, 2.0 + 8.0, 3.0 + 9.0]
    );
    let d = s.to_dense().unwrap();
    assert_eq!(d.device(), Device::Cuda(1));
    let mut expect = vec![0.0f32; 18];
    expect[3..6].copy_from_slice(&[4.0, 5.0, 6.0]);
    expect[12..15].copy_from_slice(&[8.0, 10.0, 12.0]);
    assert_eq!(d.to_vec::<f32>().unwrap(), expect);
    // Non-contiguous GPU values stay on their GPU.
    let t = Tensor::from_vec((0..6).map(|i| i as f32).collect(), &[3, 2])
        .unwrap()
        .to_device(Device::Cuda(0))
        .unwrap()
        .permute(&[1, 0])
        .unwrap();
    let s = SparseTensor::new(vec![0, 2], t, &[3, 3]).unwrap();
    assert_eq!(s.device(), Device::Cuda(0));
    assert_eq!(
        s.values().to_vec::<f32>().unwrap(),
        [0.0, 2.0, 4.0, 1.0, 3.0, 5.0]
    );
}

#[test]
fn reduce_add_of_sparse_inputs_concatenates_onto_the_destination() {
    if !two_gpus("reduce_add_of_sparse_inputs_concatenates_onto_the_destination") {
        return;
    }
    let a = rows(&[0, 5, 2], 1.0, 0);
    let b = rows(&[2, 3], 100.0, 1);
    let c = rows(&[5], -7.0, 0);
    let expect: Vec<f32> = [&a, &b, &c]
        .iter()
        .map(|s| dense_host(s))
        .fold(vec![0.0; 18], |acc, d| {
            acc.iter().zip(&d).map(|(x, y)| x + y).collect()
        });
    for destination in [0, 1] {
        let sum = comm::reduce_add_sparse(&[a.clone(), b.clone(), c.clone()], destination).unwrap();
        assert_eq!(sum.device(), Device::Cuda(destination));
        assert_eq!(sum.sizes(), &[6, 3]);
        assert_eq!(sum.nnz(), 6);
        // The first input on the destination comes first, then the others.
        let order: &[i64] = if destination == 0 {
            &[0, 5, 2, 2, 3, 5]
        } else {
            &[2, 3, 0, 5, 2, 5]
        };
        assert_eq!(sum.indices(), order);
        assert!(!sum.is_coalesced());
        assert_eq!(dense_host(&sum), expect);
        let coalesced = sum.coalesce().unwrap();
        assert_eq!(coalesced.indices(), &[0, 2, 3, 5]);
        assert_eq!(dense_host(&coalesced), expect);
    }
    // Through the one-list entry point, and with an empty input.
    let empty = rows(&[], 0.0, 1);
    let sum = comm::reduce_add_mixed(&[a.clone().into(), empty.clone().into()], 1)
        .unwrap()
        .into_sparse()
        .unwrap();
    assert_eq!((sum.device(), sum.nnz()), (Device::Cuda(1), 3));
    assert_eq!(dense_host(&sum), dense_host(&a));
    // One input: the input itself.
    let one = comm::reduce_add_sparse(std::slice::from_ref(&a), 0).unwrap();
    assert!(one.values().shares_storage(a.values()) && one.shares_indices(&a));
    // Errors name the input.
    let dense = Tensor::zeros_on(&[6, 3], DType::F32, Device::Cuda(1)).unwrap();
    assert!(matches!(
        comm::reduce_add_mixed(&[a.clone().into(), dense.clone().into()], 0),
        Err(Error::CommArgument { index: Some(1), .. })
    ));
    assert!(matches!(
        comm::reduce_add_sparse(&[a.clone(), a.to_device(Device::Cpu).unwrap()], 0),
        Err(Error::CommArgument { index: Some(1), .. })
    ));
    assert!(
        matches!(comm::reduce_add_sparse(&[a.clone(), c.clone()], 1), Err(Error::CommArgument { what, .. }) if what == "destination")
    );
    // A dense list still sums densely.
    let d = comm::reduce_add_mixed(
        &[
            CommTensor::from(a.to_dense().unwrap()),
            b.to_dense().unwrap().into(),
        ],
        1,
    )
    .unwrap()
    .into_dense()
    .unwrap();
    assert_eq!(d.device(), Device::Cuda(1));
    let ab: Vec<f32> = dense_host(&a)
        .iter()
        .zip(dense_host(&b))
        .map(|(x, y)| x + y)
        .collect();
    assert_eq!(d.to_vec::<f32>().unwrap(), ab);
}

#[test]
fn broadcast_coalesced_mixed_keeps_kinds_order_and_aliases_the_inputs() {
    if !two_gpus("broadcast_coalesced_mixed_keeps_kinds_order_and_aliases_the_inputs") {
        return;
    }
    let dense_f32 = Tensor::from_vec((0..24).map(|i| i as f32).collect(), &[2, 3, 2, 2])
        .unwrap()
        .to_device(Device::Cuda(0))
        .unwrap();
    let cl = Tensor::zeros_channels_last(&[2, 3, 2, 2], DType::F32).unwrap();
    cl.copy_from(&dense_f32).unwrap();
    let cl = cl.to_device(Device::Cuda(0)).unwrap();
    let ints = SparseTensor::new(
        vec![3, 0, 3],
        Tensor::from_vec(vec![1i64, 2, 3], &[3]).unwrap(),
        &[4],
    )
    .unwrap()
    .to_device(Device::Cuda(0))
    .unwrap();
    let items: Vec<CommTensor<'static>> = vec![
        rows(&[1, 4], 0.5, 0).into(),
        dense_f32.clone().into(),
        ints.clone().into(),
        cl.clone().into(),
        rows(&[], 0.0, 0).into(),
        Tensor::zeros_on(&[0, 5], DType::I64, Device::Cuda(0))
            .unwrap()
            .into(),
        rows(&[2, 2, 2], -1.0, 0).into(),
    ];
    for buffer in [DEFAULT_BUFFER_SIZE, 16] {
        let out = comm::broadcast_coalesced_mixed(&items, &[0, 1], buffer).unwrap();
        assert_eq!(out.len(), 2);
        for (i, (input, (same, other))) in items.iter().zip(out[0].iter().zip(&out[1])).enumerate()
        {
            assert_eq!(same.is_sparse(), input.is_sparse(), "{i}");
            assert_eq!(other.is_sparse(), input.is_sparse(), "{i}");
            assert_eq!(other.device(), Device::Cuda(1), "{i}");
            assert_eq!(other.shape(), input.shape(), "{i}");
            assert_eq!(other.dtype(), input.dtype(), "{i}");
            match (input, same, other) {
                (CommTensor::Dense(x), CommTensor::Dense(s), CommTensor::Dense(o)) => {
                    assert!(s.shares_storage(x) && s.layout() == x.layout(), "{i}");
                    assert!(!o.shares_storage(x), "{i}");
                    assert_eq!(o.strides(), x.strides(), "{i}");
                    assert_eq!(
                        o.to_device(Device::Cpu)
                            .unwrap()
                            .dense_span_bytes()
                            .unwrap(),
                        x.to_device(Device::Cpu)
                            .unwrap()
                            .dense_span_bytes()
                            .unwrap(),
                        "{i}"
                    );
                }
                (CommTensor::Sparse(x), CommTensor::Sparse(s), CommTensor::Sparse(o)) => {
                    assert!(
                        s.values().shares_storage(x.values()) && s.shares_indices(x),
                        "{i}"
                    );
                    assert!(!o.values().shares_storage(x.values()), "{i}");
                    assert!(o.shares_indices(x), "{i}");
                    assert_eq!(o.nnz(), x.nnz(), "{i}");
                    assert_eq!(o.is_coalesced(), x.is_coalesced(), "{i}");
                    let host = |t: &SparseTensor| {
                        t.to_device(Device::Cpu)
                            .unwrap()
                            .to_dense()
                            .unwrap()
                            .dense_span_bytes()
                            .unwrap()
                    };
                    assert_eq!(host(o), host(x), "{i}");
                }
                _ => panic!("tensor {i} changed kind"),
            }
        }
        assert!(out[1][3].as_dense().unwrap().is_channels_last());
    }
    // A devices list naming devices[0] twice gives the inputs twice.
    let out = comm::broadcast_coalesced_mixed(&items[..3], &[1, 1], 1024);
    assert!(matches!(
        out,
        Err(Error::CommArgument { index: Some(0), .. })
    ));
    let out = comm::broadcast_coalesced_mixed(&items[..3], &[0, 0], 1024).unwrap();
    assert!(out[1][2]
        .as_sparse()
        .unwrap()
        .values()
        .shares_storage(ints.values()));
    // A sparse tensor whose values are elsewhere is named.
    let mut wrong = items.clone();
    wrong[2] = ints.to_device(Device::Cuda(1)).unwrap().into();
    match comm::broadcast_coalesced_mixed(&wrong, &[0, 1], 1024) {
        Err(e @ Error::CommArgument { index: Some(2), .. }) => {
            assert!(
                e.to_string()
                    .contains("a sparse tensor with values on cuda:1"),
                "{e}"
            )
        }
        other => panic!("{other:?}"),
    }
}
