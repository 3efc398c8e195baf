//! The kernels against a scalar reference written independently of them
//! (wider integer arithmetic, element-by-element f32 for half floats), on
//! aligned and unaligned buffers of lengths around the chunk width.

use half::{bf16, f16};

use super::*;

/// Deterministic pseudo-random numbers (splitmix64).
fn stream(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed;
    move || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Decodes native-endian bytes into elements.
fn collect<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
    bytes
        .chunks_exact(std::mem::size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
        .collect()
}

/// Runs the kernel over `inputs` (folding left to right, then `finish`),
/// once on aligned buffers and once on buffers shifted by one byte.
fn kernel(op: ReduceOp, dtype: DType, inputs: &[Vec<u8>]) -> Vec<u8> {
    let n = inputs[0].len();
    let mut aligned = vec![0u64; n.div_ceil(8)];
    let acc: &mut [u8] = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut aligned)[..n];
    acc.copy_from_slice(&inputs[0]);
    for other in &inputs[1..] {
        reduce_into(op, dtype, acc, other).unwrap();
    }
    finish(op, dtype, acc, inputs.len()).unwrap();
    let aligned_result = acc.to_vec();

    let mut shifted = vec![0u8; n + 1];
    shifted[1..].copy_from_slice(&inputs[0]);
    for other in &inputs[1..] {
        let mut other_shifted = vec![0u8; n + 3];
        other_shifted[3..].copy_from_slice(other);
        reduce_into(op, dtype, &mut shifted[1..], &other_shifted[3..]).unwrap();
    }
    finish(op, dtype, &mut shifted[1..], inputs.len()).unwrap();
    assert_eq!(
        shifted[1..],
        aligned_result[..],
        "{op} {dtype}: unaligned differs"
    );
    aligned_result
}

macro_rules! int_case {
    ($T:ty, $dtype:expr, $op:expr, $ranks:expr, $n:expr, $seed:expr) => {{
        let mut rng = stream($seed);
        let inputs: Vec<Vec<$T>> = (0..$ranks)
            .map(|_| (0..$n).map(|_| rng() as $T).collect())
            .collect();
        let bytes: Vec<Vec<u8>> = inputs
            .iter()
            .map(|v| bytemuck::cast_slice(v).to_vec())
            .collect();
        let got: Vec<$T> = collect(&kernel($op, $dtype, &bytes));
        for i in 0..$n {
            let mut r: i128 = inputs[0][i] as i128;
            for rank in 1..$ranks {
                let b = inputs[rank][i] as i128;
                r = match $op {
                    ReduceOp::Sum | ReduceOp::Avg => (r + b) as $T as i128,
                    ReduceOp::Product => (r * b) as $T as i128,
                    ReduceOp::Min => {
                        if b < r {
                            b
                        } else {
                            r
                        }
                    }
                    ReduceOp::Max => {
                        if b > r {
                            b
                        } else {
                            r
                        }
                    }
                    ReduceOp::Band => r & b,
                    ReduceOp::Bor => r | b,
                    ReduceOp::Bxor => r ^ b,
                    ReduceOp::PremulSum(_) => unreachable!(),
                };
            }
            if $op == ReduceOp::Avg {
                r = (r / $ranks as i128) as $T as i128;
            }
            assert_eq!(
                got[i] as i128, r,
                "{} {} element {i} over {} ranks",
                $op, $dtype, $ranks
            );
        }
    }};
}

#[test]
fn integer_kernels_match_the_reference() {
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Avg,
        ReduceOp::Product,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Band,
        ReduceOp::Bor,
        ReduceOp::Bxor,
    ];
    for (k, op) in ops.into_iter().enumerate() {
        for ranks in [1usize, 2, 3, 5] {
            for n in [0usize, 1, 63, 64, 65, 203] {
                let seed = (k * 1000 + ranks * 10 + n) as u64;
                int_case!(i8, DType::I8, op, ranks, n, seed);
                int_case!(u8, DType::U8, op, ranks, n, seed);
                int_case!(i32, DType::I32, op, ranks, n, seed);
                int_case!(i64, DType::I64, op, ranks, n, seed);
            }
        }
    }
}

/// Floats: values are small multiples of 1/4 so sums and products are
/// exact in every float type, and the reference can use f64.
fn float_values(rng: &mut impl FnMut() -> u64, n: usize) -> Vec<f64> {
    (0..n).map(|_| ((rng() % 17) as f64 - 8.0) / 4.0).collect()
}

fn float_reference(op: ReduceOp, inputs: &[Vec<f64>], i: usize) -> f64 {
    let mut r = inputs[0][i];
    for input in &inputs[1..] {
        let b = input[i];
        r = match op {
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_) => r + b,
            ReduceOp::Product => r * b,
            ReduceOp::Min => {
                if b < r {
                    b
                } else {
                    r
                }
            }
            ReduceOp::Max => {
                if b > r {
                    b
                } else {
                    r
                }
            }
            _ => unreachable!(),
        };
    }
    match op {
        ReduceOp::Avg => r / inputs.len() as f64,
        ReduceOp::PremulSum(f) => r * f,
        _ => r,
    }
}

#[test]
fn float_kernels_match_the_reference() {
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Avg,
        ReduceOp::Product,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::PremulSum(0.5),
    ];
    let mut rng = stream(7);
    for op in ops {
        // Three ranks keep products of values up to 2 exact in f16's range.
        for ranks in [1usize, 2, 3, 4] {
            for n in [0usize, 1, 64, 130] {
                let inputs: Vec<Vec<f64>> = (0..ranks).map(|_| float_values(&mut rng, n)).collect();
                let expected: Vec<f64> = (0..n).map(|i| float_reference(op, &inputs, i)).collect();
                let enc = |f: &dyn Fn(f64) -> Vec<u8>| -> Vec<Vec<u8>> {
                    inputs
                        .iter()
                        .map(|v| v.iter().flat_map(|&x| f(x)).collect())
                        .collect()
                };
                let f32s: Vec<f32> = collect(&kernel(
                    op,
                    DType::F32,
                    &enc(&|x| (x as f32).to_ne_bytes().to_vec()),
                ));
                let f64s: Vec<f64> =
                    collect(&kernel(op, DType::F64, &enc(&|x| x.to_ne_bytes().to_vec())));
                let f16s: Vec<f16> = collect(&kernel(
                    op,
                    DType::F16,
                    &enc(&|x| f16::from_f64(x).to_ne_bytes().to_vec()),
                ));
                let bf16s: Vec<bf16> = collect(&kernel(
                    op,
                    DType::BF16,
                    &enc(&|x| bf16::from_f64(x).to_ne_bytes().to_vec()),
                ));
                for i in 0..n {
                    let e = expected[i];
                    // Averages of 3 are not exact: round the reference to each type.
                    assert_eq!(f64::from(f32s[i]), f64::from(e as f32), "{op} f32 {i}");
                    assert_eq!(f64s[i], e, "{op} f64 {i}");
                    assert_eq!(f16s[i], f16::from_f64(e), "{op} f16 {i}");
                    assert_eq!(bf16s[i], bf16::from_f64(e), "{op} bf16 {i}");
                }
            }
        }
    }
}

#[test]
fn bool_kernels_are_logical_and_accept_any_nonzero_byte() {
    let a = vec![0u8, 0, 1, 1, 2];
    let b = vec![0u8, 1, 0, 1, 1];
    let run = |op| kernel(op, DType::Bool, &[a.clone(), b.clone()]);
    assert_eq!(run(ReduceOp::Sum), [0, 1, 1, 1, 1]);
    assert_eq!(run(ReduceOp::Max), [0, 1, 1, 1, 1]);
    assert_eq!(run(ReduceOp::Bor), [0, 1, 1, 1, 1]);
    assert_eq!(run(ReduceOp::Product), [0, 0, 0, 1, 1]);
    assert_eq!(run(ReduceOp::Min), [0, 0, 0, 1, 1]);
    assert_eq!(run(ReduceOp::Band), [0, 0, 0, 1, 1]);
    assert_eq!(run(ReduceOp::Bxor), [0, 1, 1, 0, 0]);
}

#[test]
fn unsupported_ops_and_bad_lengths_are_refused() {
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for op in [ReduceOp::Band, ReduceOp::Bor, ReduceOp::Bxor] {
            let err = reduce_into(op, dtype, &mut [0; 8], &[0; 8]).unwrap_err();
            assert!(matches!(err, Error::UnsupportedReduceOp { .. }), "{err}");
        }
    }
    assert!(matches!(
        reduce_into(ReduceOp::PremulSum(2.0), DType::I32, &mut [0; 4], &[0; 4]),
        Err(Error::UnsupportedReduceOp { .. })
    ));
    assert!(matches!(
        finish(ReduceOp::Avg, DType::Bool, &mut [0; 4], 2),
        Err(Error::UnsupportedReduceOp { .. })
    ));
    let err = reduce_into(ReduceOp::Sum, DType::F32, &mut [0; 8], &[0; 4]).unwrap_err();
    assert!(err.to_string().contains("8 and 4"), "{err}");
    assert!(reduce_into(ReduceOp::Sum, DType::I64, &mut [0; 6], &[0; 6]).is_err());
}

#[test]
fn the_avx2_kernels_match_the_baseline_ones_bit_for_bit() {
    // On a CPU with AVX2 `reduce_into` takes the AVX2 build of the kernels
    // and `combine_any` (called directly) the baseline one; special floats
    // included, as min/max and NaN handling must not change with the
    // instruction set. Without AVX2 both are the baseline build.
    let mut rng = stream(7);
    let specials = [f64::NAN, -0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY, 1e-40];
    let dtypes = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Product,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Band,
        ReduceOp::Bor,
        ReduceOp::Bxor,
    ];
    for dtype in dtypes {
        for op in ops {
            if op.check_dtype("test", dtype).is_err() {
                continue;
            }
            for len in [1usize, 63, 64, 65, 1000] {
                let mut make = || -> Vec<u8> {
                    let mut bytes: Vec<u8> = (0..len * dtype.size()).map(|_| rng() as u8).collect();
                    if dtype.is_floating_point() {
                        // Real values (random bytes are mostly NaN-free but
                        // unstructured), with specials sprinkled in.
                        for i in 0..len {
                            let v = if rng().is_multiple_of(5) {
                                specials[(rng() % 6) as usize]
                            } else {
                                (rng() % 2001) as f64 / 100.0 - 10.0
                            };
                            let at = i * dtype.size();
                            let slot = &mut bytes[at..at + dtype.size()];
                            match dtype {
                                DType::F32 => slot.copy_from_slice(&(v as f32).to_ne_bytes()),
                                DType::F64 => slot.copy_from_slice(&v.to_ne_bytes()),
                                DType::F16 => slot.copy_from_slice(&f16::from_f64(v).to_ne_bytes()),
                                _ => slot.copy_from_slice(&bf16::from_f64(v).to_ne_bytes()),
                            }
                        }
                    }
                    bytes
                };
                let (a, b) = (make(), make());
                let mut fast = a.clone();
                reduce_into(op, dtype, &mut fast, &b).unwrap();
                let mut base = a.clone();
                combine_any(op, dtype, &mut base, &b);
                assert_eq!(fast, base, "{dtype} {op:?} len {len}");
            }
        }
    }
}
