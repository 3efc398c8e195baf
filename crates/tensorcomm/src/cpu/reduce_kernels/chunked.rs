//! Element-wise loops over fixed-width chunks.
//!
//! Each loop walks `CHUNK` elements at a time with a body the compiler sees
//! as one straight block, so it becomes SIMD code (check with
//! `cargo asm` or `objdump`: the f32 sum loop is `vaddps`/`addps`).
//! Buffers may arrive unaligned (receive buffers are plain bytes); those
//! take a path that copies each chunk into aligned locals first.

use bytemuck::Pod;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Elements per chunk: 256 bytes of f32, enough for any SIMD width.
pub(super) const CHUNK: usize = 64;

fn aligned<T>(bytes: &[u8]) -> bool {
    bytes.as_ptr().align_offset(std::mem::align_of::<T>()) == 0
}

/// `acc[i] = f(acc[i], other[i])` over the elements of two equal-length
/// byte buffers holding `T`s.
#[inline(always)]
pub(super) fn combine<T: Pod, F: Fn(T, T) -> T>(acc: &mut [u8], other: &[u8], f: F) {
    if aligned::<T>(acc) && aligned::<T>(other) {
        let a: &mut [T] = bytemuck::cast_slice_mut(acc);
        let b: &[T] = bytemuck::cast_slice(other);
        let mut ca = a.chunks_exact_mut(CHUNK);
        let mut cb = b.chunks_exact(CHUNK);
        for (x, y) in (&mut ca).zip(&mut cb) {
            for i in 0..CHUNK {
                x[i] = f(x[i], y[i]);
            }
        }
        for (x, y) in ca.into_remainder().iter_mut().zip(cb.remainder()) {
            *x = f(*x, *y);
        }
        return;
    }
    let size = std::mem::size_of::<T>();
    for (xa, xb) in acc.chunks_mut(CHUNK * size).zip(other.chunks(CHUNK * size)) {
        let n = xa.len() / size;
        let mut la = [T::zeroed(); CHUNK];
        let mut lb = [T::zeroed(); CHUNK];
        bytemuck::cast_slice_mut::<T, u8>(&mut la[..n]).copy_from_slice(xa);
        bytemuck::cast_slice_mut::<T, u8>(&mut lb[..n]).copy_from_slice(xb);
        for i in 0..n {
            la[i] = f(la[i], lb[i]);
        }
        xa.copy_from_slice(bytemuck::cast_slice(&la[..n]));
    }
}

/// `acc[i] = f(acc[i])` over a byte buffer holding `T`s.
#[inline(always)]
pub(super) fn map<T: Pod, F: Fn(T) -> T>(acc: &mut [u8], f: F) {
    if aligned::<T>(acc) {
        let a: &mut [T] = bytemuck::cast_slice_mut(acc);
        for x in a.iter_mut() {
            *x = f(*x);
        }
        return;
    }
    let size = std::mem::size_of::<T>();
    for xa in acc.chunks_mut(CHUNK * size) {
        let n = xa.len() / size;
        let mut la = [T::zeroed(); CHUNK];
        bytemuck::cast_slice_mut::<T, u8>(&mut la[..n]).copy_from_slice(xa);
        for x in la[..n].iter_mut() {
            *x = f(*x);
        }
        xa.copy_from_slice(bytemuck::cast_slice(&la[..n]));
    }
}

/// A 16-bit float stored as its bits, converted to and from f32 a chunk at
/// a time (with F16C/NEON where `half` detects it).
pub(super) trait HalfFloat: Pod {
    fn to_f32s(src: &[Self], dst: &mut [f32]);
    fn from_f32s(src: &[f32], dst: &mut [Self]);
}

impl HalfFloat for f16 {
    fn to_f32s(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn from_f32s(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
}

impl HalfFloat for bf16 {
    fn to_f32s(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn from_f32s(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
}

/// `combine` for 16-bit floats: each chunk is widened to f32, combined and
/// rounded back once.
#[inline(always)]
pub(super) fn combine_half<H: HalfFloat, F: Fn(f32, f32) -> f32>(
    acc: &mut [u8],
    other: &[u8],
    f: F,
) {
    for (xa, xb) in acc.chunks_mut(CHUNK * 2).zip(other.chunks(CHUNK * 2)) {
        let n = xa.len() / 2;
        let mut ha = [H::zeroed(); CHUNK];
        let mut hb = [H::zeroed(); CHUNK];
        bytemuck::cast_slice_mut::<H, u8>(&mut ha[..n]).copy_from_slice(xa);
        bytemuck::cast_slice_mut::<H, u8>(&mut hb[..n]).copy_from_slice(xb);
        let mut fa = [0f32; CHUNK];
        let mut fb = [0f32; CHUNK];
        H::to_f32s(&ha[..n], &mut fa[..n]);
        H::to_f32s(&hb[..n], &mut fb[..n]);
        for i in 0..CHUNK {
            fa[i] = f(fa[i], fb[i]);
        }
        H::from_f32s(&fa[..n], &mut ha[..n]);
        xa.copy_from_slice(bytemuck::cast_slice(&ha[..n]));
    }
}

/// `map` for 16-bit floats, through f32.
#[inline(always)]
pub(super) fn map_half<H: HalfFloat, F: Fn(f32) -> f32>(acc: &mut [u8], f: F) {
    for xa in acc.chunks_mut(CHUNK * 2) {
        let n = xa.len() / 2;
        let mut ha = [H::zeroed(); CHUNK];
        bytemuck::cast_slice_mut::<H, u8>(&mut ha[..n]).copy_from_slice(xa);
        let mut fa = [0f32; CHUNK];
        H::to_f32s(&ha[..n], &mut fa[..n]);
        for x in fa.iter_mut() {
            *x = f(*x);
        }
        H::from_f32s(&fa[..n], &mut ha[..n]);
        xa.copy_from_slice(bytemuck::cast_slice(&ha[..n]));
    }
}
