//! `cuda::comm` on two GPUs (and on every pair and all GPUs where there
//! are more): semantics, errors, aliasing, layouts,
//! zero-size tensors, mixed dtypes. Each test prints a line and returns when
//! the machine has no CUDA driver or fewer than two GPUs.
#![cfg(feature = "cuda")]

mod skip;

use tensorcomm::cuda::comm::{self, DEFAULT_BUFFER_SIZE};
use tensorcomm::cuda::runtime;
use tensorcomm::tensor::{DType, Device, Tensor};
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

fn seq(n: usize, shape: &[usize], seed: i32) -> Tensor<'static> {
    Tensor::from_vec(
        (0..n as i32).map(|i| (i * 7 + seed) as f32 * 0.5).collect(),
        shape,
    )
    .unwrap()
}

fn on(t: &Tensor<'_>, d: usize) -> Tensor<'static> {
    t.to_device(Device::Cuda(d)).unwrap()
}

#[test]
fn host_device_round_trips_keep_values_and_layouts() {
    if !two_gpus("host_device_round_trips_keep_values_and_layouts") {
        return;
    }
    let host = seq(120, &[2, 3, 4, 5], 1);
    let cl = Tensor::zeros_channels_last(&[2, 3, 4, 5], DType::F32).unwrap();
    cl.copy_from(&host).unwrap();
    for src in [&host, &cl] {
        let g = src.to_device(Device::Cuda(1)).unwrap();
        assert_eq!(g.strides(), src.strides());
        assert_eq!(g.to_vec::<f32>().unwrap(), host.to_vec::<f32>().unwrap());
        // GPU to GPU, across layouts (strided kernel) and back.
        let other = Tensor::zeros_on(&[2, 3, 4, 5], DType::F32, Device::Cuda(0)).unwrap();
        other.copy_from(&g.permute(&[0, 1, 2, 3]).unwrap()).unwrap();
        assert_eq!(
            other.to_vec::<f32>().unwrap(),
            host.to_vec::<f32>().unwrap()
        );
    }
    // A non-dense view copied to the host and to another GPU.
    let g = on(&host, 0);
    let col = g.narrow(3, 1, 2).unwrap();
    let expect = host.narrow(3, 1, 2).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(col.to_vec::<f32>().unwrap(), expect);
    assert_eq!(
        col.to_device(Device::Cuda(1))
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        expect
    );
    // Pinned host tensors.
    let pinned = Tensor::zeros_pinned(&[4], DType::I64).unwrap();
    pinned
        .copy_from(&on(
            &Tensor::from_vec(vec![1i64, 2, 3, 4], &[4]).unwrap(),
            1,
        ))
        .unwrap();
    assert_eq!(pinned.to_vec::<i64>().unwrap(), [1, 2, 3, 4]);
}

#[test]
fn cudarc_slices_are_viewed_without_copies() {
    if !two_gpus("cudarc_slices_are_viewed_without_copies") {
        return;
    }
    let ctx = cudarc::driver::CudaContext::new(1).unwrap();
    let stream = ctx.default_stream();
    let mut slice = stream.clone_htod(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    {
        let t = Tensor::from_cuda_slice_mut(&mut slice, &[2, 2]).unwrap();
        assert_eq!(t.device(), Device::Cuda(1));
        let copies = comm::broadcast(&t, &[1, 0]).unwrap();
        assert!(copies[0].shares_storage(&t));
        copies[0]
            .copy_from(&Tensor::from_vec(vec![5.0f32; 4], &[2, 2]).unwrap())
            .unwrap();
    }
    assert_eq!(stream.clone_dtoh(&slice).unwrap(), [5.0; 4]);
    let owned = Tensor::from_cuda_slice(slice, &[4]).unwrap();
    assert_eq!(owned.to_vec::<f32>().unwrap(), [5.0; 4]);
    assert!(matches!(
        Tensor::from_cuda_slice(stream.clone_htod(&[1u8; 3]).unwrap(), &[2]),
        Err(Error::ShapeMismatch { .. })
    ));
}

#[test]
fn broadcast_aliases_the_source_device_and_copies_elsewhere() {
    if !two_gpus("broadcast_aliases_the_source_device_and_copies_elsewhere") {
        return;
    }
    let host = seq(1000, &[10, 100], 3);
    let x = on(&host, 0);
    let out = comm::broadcast(&x, &[0, 1]).unwrap();
    assert!(out[0].shares_storage(&x));
    assert!(!out[1].shares_storage(&x));
    assert_eq!(out[1].device(), Device::Cuda(1));
    assert_eq!(
        out[1].to_vec::<f32>().unwrap(),
        host.to_vec::<f32>().unwrap()
    );
    // From the host, to both GPUs.
    let from_cpu = comm::broadcast(&host, &[1, 0]).unwrap();
    assert_eq!(from_cpu[0].device(), Device::Cuda(1));
    assert_eq!(
        from_cpu[1].to_vec::<f32>().unwrap(),
        host.to_vec::<f32>().unwrap()
    );
    // Channels-last survives; a transposed view comes out with its strides.
    let cl = Tensor::zeros_channels_last(&[2, 4, 3, 3], DType::F32).unwrap();
    cl.copy_from(&seq(72, &[2, 4, 3, 3], 0)).unwrap();
    let b = comm::broadcast(&on(&cl, 0), &[1]).unwrap();
    assert!(b[0].is_channels_last());
    assert_eq!(b[0].to_vec::<f32>().unwrap(), cl.to_vec::<f32>().unwrap());
    // Errors.
    assert!(matches!(
        comm::broadcast(&x, &[0, -1]),
        Err(Error::CommArgument { index: Some(1), .. })
    ));
    assert!(matches!(
        comm::broadcast(&x, &[99]),
        Err(Error::NoCuda { .. })
    ));
}

#[test]
fn broadcast_out_checks_everything_before_writing() {
    if !two_gpus("broadcast_out_checks_everything_before_writing") {
        return;
    }
    let x = on(&seq(6, &[2, 3], 1), 0);
    let good = Tensor::zeros_on(&[2, 3], DType::F32, Device::Cuda(1)).unwrap();
    let bad_shape = Tensor::zeros_on(&[3, 2], DType::F32, Device::Cuda(0)).unwrap();
    match comm::broadcast_out(&x, &[good.clone(), bad_shape]) {
        Err(e @ Error::CommArgument { index: Some(1), .. }) => {
            let m = e.to_string();
            assert!(m.contains("[2, 3]") && m.contains("[3, 2]"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        good.to_vec::<f32>().unwrap(),
        [0.0; 6],
        "nothing written on failure"
    );
    let bad_dtype = Tensor::zeros_on(&[2, 3], DType::F64, Device::Cuda(1)).unwrap();
    assert!(matches!(
        comm::broadcast_out(&x, &[good.clone(), bad_dtype]),
        Err(Error::CommArgument { index: Some(1), .. })
    ));
    // A transposed output receives the right values.
    let t_out = Tensor::zeros_on(&[3, 2], DType::F32, Device::Cuda(1))
        .unwrap()
        .permute(&[1, 0])
        .unwrap();
    comm::broadcast_out(&x, &[good.clone(), t_out.clone()]).unwrap();
    assert_eq!(good.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    assert_eq!(t_out.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
}

#[test]
fn broadcast_coalesced_keeps_order_dtypes_shapes_and_ownership() {
    if !two_gpus("broadcast_coalesced_keeps_order_dtypes_shapes_and_ownership") {
        return;
    }
    let hosts = [
        seq(300, &[3, 100], 0),
        Tensor::from_vec((0..50i64).collect(), &[50]).unwrap(),
        Tensor::zeros(&[0, 4], DType::F32).unwrap(),
        Tensor::from_vec(
            (0..33).map(|i| half::bf16::from_f32(i as f32)).collect(),
            &[33],
        )
        .unwrap(),
        seq(7, &[7], 2),
        Tensor::from_bools(&[true, false, true], &[3]).unwrap(),
        Tensor::from_vec((0..5u8).collect(), &[5]).unwrap(),
    ];
    let inputs: Vec<Tensor<'static>> = hosts.iter().map(|h| on(h, 0)).collect();
    let views: Vec<Tensor<'static>> = inputs.iter().map(Clone::clone).collect();
    for buffer in [DEFAULT_BUFFER_SIZE, 64, 1] {
        let out = comm::broadcast_coalesced(&views, &[0, 1], buffer).unwrap();
        assert_eq!(out.len(), 2);
        for (i, h) in hosts.iter().enumerate() {
            assert!(out[0][i].shares_storage(&inputs[i]));
            let o = &out[1][i];
            assert_eq!(
                (o.device(), o.dtype(), o.shape()),
                (Device::Cuda(1), h.dtype(), h.shape()),
                "tensor {i}"
            );
            assert_eq!(o.storage_handle_count(), 1, "tensor {i} owns its storage");
            assert_eq!(
                o.to_device(Device::Cpu)
                    .unwrap()
                    .dense_span_bytes()
                    .unwrap(),
                h.dense_span_bytes().unwrap(),
                "tensor {i}"
            );
        }
    }
    // Strided inputs come out with the right values.
    let t = on(&seq(12, &[3, 4], 5), 0).permute(&[1, 0]).unwrap();
    let col = on(&seq(12, &[3, 4], 5), 0).narrow(1, 1, 2).unwrap();
    let out = comm::broadcast_coalesced(&[t.clone(), col.clone()], &[0, 1], 1 << 20).unwrap();
    assert_eq!(
        out[1][0].to_vec::<f32>().unwrap(),
        t.to_vec::<f32>().unwrap()
    );
    assert_eq!(
        out[1][1].to_vec::<f32>().unwrap(),
        col.to_vec::<f32>().unwrap()
    );
    // Inputs not on devices[0].
    let wrong = vec![on(&hosts[0], 0), on(&hosts[4], 1)];
    match comm::broadcast_coalesced(&wrong, &[0, 1], 1024) {
        Err(e @ Error::CommArgument { index: Some(1), .. }) => {
            assert!(e.to_string().contains("cuda:1"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn broadcast_coalesced_of_large_and_many_tensors_copies_every_one() {
    let test = "broadcast_coalesced_of_large_and_many_tensors_copies_every_one";
    if !two_gpus(test) {
        return;
    }
    // Tensors past the copy-engine threshold (4 MiB), more than one queued
    // group (16 MiB) and more than one kernel launch (96 ranges), and a
    // device list naming both GPUs twice.
    let mut hosts: Vec<Tensor<'static>> = (0..5).map(|k| seq(3 << 20, &[3 << 20], k)).collect();
    hosts.extend((0..150).map(|k| seq(100 + k as usize, &[100 + k as usize], k)));
    hosts.push(seq(1 << 20, &[1024, 1024], 9));
    let inputs: Vec<Tensor<'static>> = hosts.iter().map(|h| on(h, 0)).collect();
    for buffer in [25 << 20, 1 << 20] {
        let out = comm::broadcast_coalesced(&inputs, &[0, 1, 0, 1], buffer).unwrap();
        assert_eq!(out.len(), 4);
        for (i, h) in hosts.iter().enumerate() {
            assert!(out[0][i].shares_storage(&inputs[i]) && out[2][i].shares_storage(&inputs[i]));
            for k in [1, 3] {
                let o = &out[k][i];
                assert_eq!(o.device(), Device::Cuda(1), "output {k}, tensor {i}");
                assert_eq!(o.storage_handle_count(), 1, "output {k}, tensor {i}");
                assert_eq!(
                    o.to_vec::<f32>().unwrap(),
                    h.to_vec::<f32>().unwrap(),
                    "output {k}, tensor {i}"
                );
            }
        }
    }
}

#[test]
fn scatter_splits_views_and_copies_with_streams_and_layouts() {
    if !two_gpus("scatter_splits_views_and_copies_with_streams_and_layouts") {
        return;
    }
    let host = seq(40, &[10, 4], 0);
    let x = on(&host, 0);
    let parts = comm::scatter(&x, &[0, 1], None, 0, None).unwrap();
    assert!(parts[0].shares_storage(&x));
    assert_eq!(parts[1].device(), Device::Cuda(1));
    assert_eq!(
        parts[1].to_vec::<f32>().unwrap(),
        host.narrow(0, 5, 5).unwrap().to_vec::<f32>().unwrap()
    );
    // Explicit sizes, negative dim, user streams.
    let streams = [
        Some(runtime::Stream::new(0).unwrap()),
        Some(runtime::Stream::new(1).unwrap()),
    ];
    let parts = comm::scatter(&x, &[1, 0], Some(&[3, 1]), -1, Some(&streams[..])).unwrap_err();
    assert!(
        matches!(parts, Error::CommArgument { index: Some(0), .. }),
        "stream 0 is on cuda:0, device 0 is cuda:1"
    );
    let parts = comm::scatter(&x, &[0, 1], Some(&[3, 1]), -1, Some(&streams[..])).unwrap();
    assert_eq!(parts[0].shape(), &[10, 3]);
    assert_eq!(
        parts[1].to_vec::<f32>().unwrap(),
        host.narrow(1, 3, 1).unwrap().to_vec::<f32>().unwrap()
    );
    // Fewer chunks than devices.
    let small = on(&seq(2, &[2], 0), 1);
    assert_eq!(
        comm::scatter(&small, &[0, 1, 0], None, 0, None)
            .unwrap()
            .len(),
        2
    );
    // Channels-last, split along batch (dense chunks) and channels (not dense).
    let cl = Tensor::zeros_channels_last(&[4, 6, 3, 3], DType::F32).unwrap();
    cl.copy_from(&seq(216, &[4, 6, 3, 3], 1)).unwrap();
    let g = on(&cl, 0);
    for dim in [0, 1] {
        let parts = comm::scatter(&g, &[0, 1], None, dim, None).unwrap();
        assert!(parts[1].is_channels_last(), "dim {dim}");
        assert_eq!(
            parts[1].to_vec::<f32>().unwrap(),
            cl.chunk(2, dim).unwrap()[1].to_vec::<f32>().unwrap()
        );
    }
    // scatter_out.
    let outs = [
        Tensor::zeros_on(&[6, 4], DType::F32, Device::Cuda(1)).unwrap(),
        Tensor::zeros_on(&[4, 4], DType::F32, Device::Cuda(0)).unwrap(),
    ];
    comm::scatter_out(&x, &outs, 0, None).unwrap();
    assert_eq!(
        outs[1].to_vec::<f32>().unwrap(),
        host.narrow(0, 6, 4).unwrap().to_vec::<f32>().unwrap()
    );
    let bad = [
        Tensor::zeros_on(&[6, 4], DType::F32, Device::Cuda(1)).unwrap(),
        Tensor::zeros_on(&[3, 4], DType::F32, Device::Cuda(0)).unwrap(),
    ];
    assert!(matches!(
        comm::scatter_out(&x, &bad, 0, None),
        Err(Error::CommArgument { .. })
    ));
    assert_eq!(
        bad[0].to_vec::<f32>().unwrap(),
        [0.0; 24],
        "nothing written on failure"
    );
    // Zero-size.
    let empty = on(&Tensor::zeros(&[0, 3], DType::F32).unwrap(), 0);
    let parts = comm::scatter(&empty, &[0, 1], None, 0, None).unwrap();
    assert_eq!((parts.len(), parts[1].shape()), (2, &[0, 3][..]));
}

#[test]
fn gather_concatenates_onto_gpus_and_the_host() {
    if !two_gpus("gather_concatenates_onto_gpus_and_the_host") {
        return;
    }
    let a = seq(12, &[3, 4], 0);
    let b = seq(8, &[2, 4], 9);
    let ga = on(&a, 0);
    let gb = on(&b, 1);
    let expect: Vec<f32> = [a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap()].concat();
    for dest in [Device::Cuda(0), Device::Cuda(1), Device::Cpu] {
        let g = comm::gather(&[ga.clone(), gb.clone()], 0, dest).unwrap();
        assert_eq!((g.device(), g.shape()), (dest, &[5, 4][..]));
        assert_eq!(g.to_vec::<f32>().unwrap(), expect);
    }
    let g = comm::gather(
        &[ga.clone(), on(&seq(6, &[3, 2], 1), 1)],
        -1,
        Device::Cuda(0),
    )
    .unwrap();
    assert_eq!(g.shape(), &[3, 6]);
    assert_eq!(
        g.narrow(1, 4, 2).unwrap().to_vec::<f32>().unwrap(),
        seq(6, &[3, 2], 1).to_vec::<f32>().unwrap()
    );
    // Channels-last only when every input is.
    let cl = Tensor::zeros_channels_last(&[1, 3, 2, 2], DType::F32).unwrap();
    cl.copy_from(&seq(12, &[1, 3, 2, 2], 0)).unwrap();
    let both = comm::gather(&[on(&cl, 0), on(&cl, 1)], 0, Device::Cuda(0)).unwrap();
    assert!(both.is_channels_last());
    let mixed = comm::gather(
        &[on(&cl, 0), on(&seq(12, &[1, 3, 2, 2], 0), 1)],
        0,
        Device::Cuda(0),
    )
    .unwrap();
    assert!(mixed.is_contiguous());
    assert_eq!(
        mixed.narrow(0, 0, 1).unwrap().to_vec::<f32>().unwrap(),
        cl.to_vec::<f32>().unwrap()
    );
    // Errors name the tensor.
    match comm::gather(
        &[ga.clone(), on(&seq(6, &[2, 3], 0), 1)],
        0,
        Device::Cuda(0),
    ) {
        Err(e @ Error::CommArgument { index: Some(1), .. }) => assert!(
            e.to_string().contains("[2, 4]") && e.to_string().contains("[2, 3]"),
            "{e}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        comm::gather(&[ga.clone(), on(&seq(4, &[4], 0), 1)], 0, Device::Cpu),
        Err(Error::CommArgument { index: Some(1), .. })
    ));
    assert!(matches!(
        comm::gather(&[ga.clone(), b.clone()], 0, Device::Cpu),
        Err(Error::CommArgument { index: Some(1), .. })
    ));
    let out = Tensor::zeros_on(&[5, 4], DType::F32, Device::Cuda(1)).unwrap();
    comm::gather_out(&[ga.clone(), gb.clone()], &out, 0).unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), expect);
    let wrong = Tensor::zeros_on(&[6, 4], DType::F32, Device::Cuda(1)).unwrap();
    assert!(matches!(
        comm::gather_out(&[ga, gb], &wrong, 0),
        Err(Error::CommArgument { .. })
    ));
}

#[test]
fn reduce_add_sums_every_dtype_onto_the_destination() {
    if !two_gpus("reduce_add_sums_every_dtype_onto_the_destination") {
        return;
    }
    let n = 1003; // not a multiple of any vector width: exercises the tail
    let a = Tensor::from_vec((0..n as i32).collect(), &[n]).unwrap();
    let b = Tensor::from_vec((0..n as i32).map(|i| 3 * i - 7).collect(), &[n]).unwrap();
    let s = comm::reduce_add(&[on(&a, 0), on(&b, 1)], 1).unwrap();
    assert_eq!(s.device(), Device::Cuda(1));
    assert_eq!(
        s.to_vec::<i32>().unwrap(),
        (0..n as i32).map(|i| 4 * i - 7).collect::<Vec<_>>()
    );
    let f16 = |v: f32| half::f16::from_f32(v);
    let h = comm::reduce_add(
        &[
            on(&Tensor::from_vec(vec![f16(1.5); 17], &[17]).unwrap(), 0),
            on(&Tensor::from_vec(vec![f16(2.25); 17], &[17]).unwrap(), 1),
        ],
        0,
    )
    .unwrap();
    assert_eq!(h.to_vec::<half::f16>().unwrap(), vec![f16(3.75); 17]);
    let bf = |v: f32| half::bf16::from_f32(v);
    let h = comm::reduce_add(
        &[
            on(&Tensor::from_vec(vec![bf(-1.0); 9], &[9]).unwrap(), 0),
            on(&Tensor::from_vec(vec![bf(4.0); 9], &[9]).unwrap(), 1),
        ],
        0,
    )
    .unwrap();
    assert_eq!(h.to_vec::<half::bf16>().unwrap(), vec![bf(3.0); 9]);
    let bools = comm::reduce_add(
        &[
            on(&Tensor::from_bools(&[true, false, false], &[3]).unwrap(), 0),
            on(&Tensor::from_bools(&[false, false, true], &[3]).unwrap(), 1),
        ],
        0,
    )
    .unwrap();
    assert_eq!(bools.to_vec_bool().unwrap(), [true, false, true]);
    let i8s = comm::reduce_add(
        &[
            on(&Tensor::from_vec(vec![100i8; 5], &[5]).unwrap(), 0),
            on(&Tensor::from_vec(vec![100i8; 5], &[5]).unwrap(), 1),
        ],
        0,
    )
    .unwrap();
    assert_eq!(
        i8s.to_vec::<i8>().unwrap(),
        vec![100i8.wrapping_add(100); 5]
    );
    let f64s = comm::reduce_add(
        &[
            on(&Tensor::from_vec(vec![0.25f64; 3], &[3]).unwrap(), 1),
            on(&Tensor::from_vec(vec![0.5f64; 3], &[3]).unwrap(), 0),
            on(&Tensor::from_vec(vec![1.0f64; 3], &[3]).unwrap(), 1),
        ],
        0,
    )
    .unwrap();
    assert_eq!(f64s.to_vec::<f64>().unwrap(), [1.75; 3]);
    // Layouts: a channels-last root and a contiguous peer.
    let cl = Tensor::zeros_channels_last(&[2, 3, 2, 2], DType::F32).unwrap();
    cl.copy_from(&seq(24, &[2, 3, 2, 2], 0)).unwrap();
    let s = comm::reduce_add(&[on(&cl, 0), on(&seq(24, &[2, 3, 2, 2], 0), 1)], 0).unwrap();
    assert!(s.is_channels_last());
    assert_eq!(
        s.to_vec::<f32>().unwrap(),
        seq(24, &[2, 3, 2, 2], 0)
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| 2.0 * v)
            .collect::<Vec<_>>()
    );
    // One input: the input itself.
    let x = on(&a, 0);
    assert!(comm::reduce_add(std::slice::from_ref(&x), 0)
        .unwrap()
        .shares_storage(&x));
    // Errors.
    assert!(matches!(
        comm::reduce_add(&[on(&a, 0), on(&a.narrow(0, 0, 5).unwrap(), 1)], 0),
        Err(Error::CommArgument { index: Some(1), .. })
    ));
    assert!(
        matches!(comm::reduce_add(&[on(&a, 0), on(&a, 0)], 1), Err(Error::CommArgument { what, .. }) if what == "destination")
    );
    assert!(matches!(
        comm::reduce_add(&[on(&a, 0), a.clone()], 0),
        Err(Error::CommArgument { index: Some(1), .. })
    ));
}

#[test]
fn reduce_add_coalesced_sums_lists_in_buckets() {
    if !two_gpus("reduce_add_coalesced_sums_lists_in_buckets") {
        return;
    }
    let make = |scale: f32, d: usize| -> Vec<Tensor<'static>> {
        vec![
            on(
                &Tensor::from_vec((0..100).map(|i| i as f32 * scale).collect(), &[10, 10]).unwrap(),
                d,
            ),
            on(
                &Tensor::from_vec((0..7i64).map(|i| i * scale as i64).collect(), &[7]).unwrap(),
                d,
            ),
            on(&Tensor::zeros(&[0], DType::F32).unwrap(), d),
            on(
                &Tensor::from_vec((0..30).map(|i| i as f32).collect(), &[30]).unwrap(),
                d,
            ),
        ]
    };
    for buffer in [DEFAULT_BUFFER_SIZE, 16] {
        let sums = comm::reduce_add_coalesced(&[make(1.0, 0), make(2.0, 1)], 1, buffer).unwrap();
        assert_eq!(sums.len(), 4);
        assert!(sums.iter().all(|t| t.device() == Device::Cuda(1)));
        assert_eq!(
            sums[0].to_vec::<f32>().unwrap(),
            (0..100).map(|i| 3.0 * i as f32).collect::<Vec<_>>()
        );
        assert_eq!(
            sums[1].to_vec::<i64>().unwrap(),
            (0..7i64).map(|i| 3 * i).collect::<Vec<_>>()
        );
        assert_eq!(sums[2].shape(), &[0]);
        assert_eq!(
            sums[3].to_vec::<f32>().unwrap(),
            (0..30).map(|i| 2.0 * i as f32).collect::<Vec<_>>()
        );
    }
    let mut short = make(1.0, 1);
    short.pop();
    assert!(matches!(
        comm::reduce_add_coalesced(&[make(1.0, 0), short], 0, 1024),
        Err(Error::CommArgument { index: Some(1), .. })
    ));
}

/// The GPU count, or `None` (having said why) where there are fewer than
/// `least`.
fn gpus(test: &str, least: usize) -> Option<usize> {
    match runtime::device_count() {
        Ok(n) if n >= least => Some(n),
        Ok(n) => {
            skip::skipped(test, format!("needs {least} GPUs, found {n}"));
            None
        }
        Err(e) => {
            skip::skipped(test, e);
            None
        }
    }
}

/// `n` small integers (exact in every float dtype when summed a few times).
fn ints(n: usize, seed: i32) -> Vec<f32> {
    (0..n as i32)
        .map(|i| ((i * 31 + seed) % 97) as f32)
        .collect()
}

#[test]
fn every_pair_of_gpus_broadcasts_scatters_gathers_and_reduces() {
    const TEST: &str = "every_pair_of_gpus_broadcasts_scatters_gathers_and_reduces";
    let Some(n) = gpus(TEST, 2) else {
        return;
    };
    // A kernel-copied size and one the copy engines take (4 MiB and more).
    for numel in [1001, (5 << 20) / 4 + 3] {
        let x = Tensor::from_vec(ints(numel, 1), &[numel]).unwrap();
        let y = Tensor::from_vec(ints(numel, 2), &[numel]).unwrap();
        let sum: Vec<f32> = ints(numel, 1)
            .iter()
            .zip(ints(numel, 2))
            .map(|(a, b)| a + b)
            .collect();
        for a in 0..n {
            for b in (0..n).filter(|&b| b != a) {
                let what = format!("cuda:{a} -> cuda:{b}, {numel} elements");
                let (xa, yb) = (on(&x, a), on(&y, b));
                let out = comm::broadcast(&xa, &[a as i64, b as i64]).unwrap();
                assert!(out[0].shares_storage(&xa), "{what}");
                assert_eq!(out[1].device(), Device::Cuda(b), "{what}");
                assert_eq!(out[1].to_vec::<f32>().unwrap(), ints(numel, 1), "{what}");
                let parts = comm::scatter(&xa, &[b as i64, a as i64], None, 0, None).unwrap();
                assert_eq!(parts[0].device(), Device::Cuda(b), "{what}");
                let back = comm::gather(&parts, 0, Device::Cuda(b)).unwrap();
                assert_eq!(back.to_vec::<f32>().unwrap(), ints(numel, 1), "{what}");
                let s = comm::reduce_add(&[xa, yb], b).unwrap();
                assert_eq!(s.device(), Device::Cuda(b), "{what}");
                assert_eq!(s.to_vec::<f32>().unwrap(), sum, "{what}");
            }
        }
    }
}

#[test]
fn all_gpus_of_the_process_broadcast_and_reduce_along_a_chain() {
    const TEST: &str = "all_gpus_of_the_process_broadcast_and_reduce_along_a_chain";
    let Some(n) = gpus(TEST, 3) else {
        return;
    };
    // Below the chain's 8 MiB (fan-out), just above it (one 8 MiB chunk
    // and a 20-byte tail), and 72 MiB + 3 elements: nine 8 MiB chunks and
    // a ragged tail for f32 (the reduction's ring of 4 slots wraps), five
    // for bf16.
    for numel in [4099, (8 << 20) / 4 + 5, (72 << 20) / 4 + 3] {
        let x = Tensor::from_vec(ints(numel, 3), &[numel]).unwrap();
        for root in [0, n - 1] {
            // The root first, then the others in an order that is not
            // the GPUs' own.
            let mut devices: Vec<i64> = vec![root as i64];
            devices.extend((0..n).rev().filter(|&d| d != root).map(|d| d as i64));
            let what = format!("{numel} elements from cuda:{root} to {devices:?}");
            let src = on(&x, root);
            let out = comm::broadcast(&src, &devices).unwrap();
            assert!(out[0].shares_storage(&src), "{what}");
            for (o, &d) in out.iter().zip(&devices) {
                assert_eq!(o.device(), Device::Cuda(d as usize), "{what}");
                assert_eq!(o.to_vec::<f32>().unwrap(), ints(numel, 3), "{what}");
            }
            // broadcast_out into tensors of every GPU but the root's.
            let outs: Vec<Tensor<'static>> = devices[1..]
                .iter()
                .map(|&d| Tensor::zeros_on(&[numel], DType::F32, Device::Cuda(d as usize)).unwrap())
                .collect();
            comm::broadcast_out(&src, &outs).unwrap();
            for o in &outs {
                assert_eq!(o.to_vec::<f32>().unwrap(), ints(numel, 3), "out: {what}");
            }
            // reduce_add of one input per GPU, in `devices` order, onto the root.
            let inputs: Vec<Tensor<'static>> = devices
                .iter()
                .map(|&d| {
                    on(
                        &Tensor::from_vec(ints(numel, d as i32), &[numel]).unwrap(),
                        d as usize,
                    )
                })
                .collect();
            let mut want = vec![0f32; numel];
            for d in 0..n as i32 {
                for (w, v) in want.iter_mut().zip(ints(numel, d)) {
                    *w += v;
                }
            }
            let s = comm::reduce_add(&inputs, root).unwrap();
            assert_eq!(s.device(), Device::Cuda(root), "sum: {what}");
            assert_eq!(s.to_vec::<f32>().unwrap(), want, "sum: {what}");
            // bf16 (small integers stay exact), onto the last input's GPU.
            let bf = |v: f32| half::bf16::from_f32(v);
            let halves: Vec<Tensor<'static>> = devices
                .iter()
                .map(|&d| {
                    let v = (0..numel)
                        .map(|i| bf(((i + d as usize) % 5) as f32))
                        .collect();
                    on(&Tensor::from_vec(v, &[numel]).unwrap(), d as usize)
                })
                .collect();
            let dest = *devices.last().unwrap() as usize;
            let s = comm::reduce_add(&halves, dest).unwrap();
            let got = s.to_vec::<half::bf16>().unwrap();
            for (i, g) in got.iter().enumerate() {
                let want: usize = (0..n).map(|d| (i + d) % 5).sum();
                assert_eq!(g.to_f32(), want as f32, "bf16 sum at {i}: {what}");
            }
        }
    }
    // broadcast_coalesced of a model-like set (about 14 MiB: chained) to
    // every GPU, with a strided (not dense) view among them, which is
    // copied apart from the chain.
    let mut params: Vec<Tensor<'static>> = (0..12)
        .map(|i| {
            let numel = 300_000 + i * 1001;
            on(
                &Tensor::from_vec(ints(numel, i as i32), &[numel]).unwrap(),
                0,
            )
        })
        .collect();
    params.push(on(&seq(128, &[16, 8], 5), 0).narrow(1, 1, 4).unwrap());
    let devices: Vec<i64> = (0..n as i64).collect();
    let copies = comm::broadcast_coalesced(&params, &devices, 1 << 20).unwrap();
    for (k, list) in copies.iter().enumerate() {
        for (p, c) in params.iter().zip(list) {
            assert_eq!(c.device(), Device::Cuda(k), "coalesced copy on GPU {k}");
            assert_eq!(c.shape(), p.shape());
            assert_eq!(
                c.to_vec::<f32>().unwrap(),
                p.to_vec::<f32>().unwrap(),
                "GPU {k}"
            );
        }
    }
}
