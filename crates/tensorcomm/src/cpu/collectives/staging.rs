//! Copies between tensors and the byte buffers algorithms work on, in
//! logical (row-major) element order whatever the tensor's dense layout.
//! A contiguous tensor is one block copy; any other layout goes through a
//! contiguous temporary.

use super::scratch::{self, Scratch};
use crate::tensor::Tensor;
use crate::Result;

/// Copies the elements of `t` into `dst` (exactly `t.nbytes()` long).
pub(super) fn read_into(t: &Tensor<'_>, dst: &mut [u8]) -> Result<()> {
    if t.is_contiguous() {
        return t.with_bytes(|src| dst.copy_from_slice(src));
    }
    t.contiguous()?.with_bytes(|src| dst.copy_from_slice(src))
}

/// The elements of `t`, concatenated over `tensors`, in one buffer
/// (copied once: the buffer is not zeroed first).
pub(super) fn read_all(tensors: &[Tensor<'_>]) -> Result<Scratch> {
    let mut out = scratch::empty(tensors.iter().map(Tensor::nbytes).sum());
    for t in tensors {
        if t.is_contiguous() {
            t.with_bytes(|src| out.extend_from_slice(src))?;
        } else {
            t.contiguous()?
                .with_bytes(|src| out.extend_from_slice(src))?;
        }
    }
    Ok(out)
}

/// The elements of `t` in one buffer (see [`read_all`]).
pub(super) fn read_copy(t: &Tensor<'_>) -> Result<Scratch> {
    read_all(std::slice::from_ref(t))
}

/// Writes `src` (exactly `t.nbytes()` long) into the elements of `t`.
pub(super) fn write_from(t: &Tensor<'_>, src: &[u8]) -> Result<()> {
    if t.is_contiguous() {
        return t.with_bytes_mut(|dst| dst.copy_from_slice(src));
    }
    let staged = Tensor::zeros(t.shape(), t.dtype())?;
    staged.with_bytes_mut(|dst| dst.copy_from_slice(src))?;
    t.copy_from(&staged)
}

/// Writes consecutive pieces of `src` into `tensors`, in order.
pub(super) fn write_all(tensors: &[Tensor<'_>], src: &[u8]) -> Result<()> {
    let mut at = 0;
    for t in tensors {
        write_from(t, &src[at..at + t.nbytes()])?;
        at += t.nbytes();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permuted_tensors_round_trip_in_logical_order() {
        let t = Tensor::from_vec((0..6i32).collect(), &[2, 3]).unwrap();
        let p = t.permute(&[1, 0]).unwrap(); // logical [[0, 3], [1, 4], [2, 5]]
        let mut bytes = vec![0u8; 24];
        read_into(&p, &mut bytes).unwrap();
        let logical: Vec<i32> = bytes
            .chunks_exact(4)
            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(logical, [0, 3, 1, 4, 2, 5]);
        let back: Vec<u8> = [9, 8, 7, 6, 5, 4i32]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        write_from(&p, &back).unwrap();
        assert_eq!(p.to_vec::<i32>().unwrap(), [9, 8, 7, 6, 5, 4]);
        assert_eq!(t.to_vec::<i32>().unwrap(), [9, 7, 5, 8, 6, 4]);
        let both = [t.clone(), p.clone()];
        let all = read_all(&both).unwrap();
        assert_eq!(all.len(), 48);
        write_all(&both, &all).unwrap();
        assert_eq!(t.to_vec::<i32>().unwrap(), [9, 7, 5, 8, 6, 4]);
    }
}
