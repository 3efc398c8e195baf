//! The small dense matrix maths PowerSGD needs, on row-major `f32`
//! slices: products with one side transposed and Gram-Schmidt
//! orthogonalization of columns.

/// `a · b` for `a` of `n × k` and `b` of `k × m`: an `n × m` matrix.
pub(super) fn mul(a: &[f32], b: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n * m];
    for i in 0..n {
        let row = &mut out[i * m..(i + 1) * m];
        for (l, &x) in a[i * k..(i + 1) * k].iter().enumerate() {
            for (o, &y) in row.iter_mut().zip(&b[l * m..(l + 1) * m]) {
                *o += x * y;
            }
        }
    }
    out
}

/// `aᵀ · b` for `a` of `n × m` and `b` of `n × r`: an `m × r` matrix.
pub(super) fn mul_at_b(a: &[f32], b: &[f32], n: usize, m: usize, r: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; m * r];
    for i in 0..n {
        let b_row = &b[i * r..(i + 1) * r];
        for (j, &x) in a[i * m..(i + 1) * m].iter().enumerate() {
            for (o, &y) in out[j * r..(j + 1) * r].iter_mut().zip(b_row) {
                *o += x * y;
            }
        }
    }
    out
}

/// `a · bᵀ` for `a` of `n × r` and `b` of `m × r`: an `n × m` matrix.
pub(super) fn mul_a_bt(a: &[f32], b: &[f32], n: usize, m: usize, r: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n * m];
    for i in 0..n {
        let a_row = &a[i * r..(i + 1) * r];
        for j in 0..m {
            out[i * m + j] = a_row
                .iter()
                .zip(&b[j * r..(j + 1) * r])
                .map(|(x, y)| x * y)
                .sum();
        }
    }
    out
}

/// Orthonormalizes the `cols` columns of the row-major `rows × cols`
/// matrix in place by Gram-Schmidt, left to right (c10d's
/// `_orthogonalize_gram_schmidt`): each column is divided by its norm plus
/// `epsilon`, then its projection is removed from the columns to its right.
/// A column whose norm plus `epsilon` is 0 is left as zeros (c10d would
/// give NaN there).
pub(super) fn orthogonalize(matrix: &mut [f32], rows: usize, cols: usize, epsilon: f32) {
    for c in 0..cols {
        let norm = (0..rows)
            .map(|i| matrix[i * cols + c] * matrix[i * cols + c])
            .sum::<f32>()
            .sqrt();
        let divisor = norm + epsilon;
        if divisor > 0.0 {
            for i in 0..rows {
                matrix[i * cols + c] /= divisor;
            }
        }
        for rest in c + 1..cols {
            let dot: f32 = (0..rows)
                .map(|i| matrix[i * cols + c] * matrix[i * cols + rest])
                .sum();
            for i in 0..rows {
                matrix[i * cols + rest] -= dot * matrix[i * cols + c];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_match_their_definitions() {
        // a: 2x3, b: 3x2.
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        assert_eq!(mul(&a, &b, 2, 3, 2), [4.0, 5.0, 10.0, 11.0]);
        // aᵀ · c for c of 2x1.
        assert_eq!(mul_at_b(&a, &[1.0, 2.0], 2, 3, 1), [9.0, 12.0, 15.0]);
        // a · bᵀ for a 2x1 and b 3x1: an outer product.
        assert_eq!(
            mul_a_bt(&[1.0, 2.0], &[3.0, 4.0, 5.0], 2, 3, 1),
            [3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        );
    }

    #[test]
    fn gram_schmidt_gives_orthonormal_columns() {
        let mut m = vec![3.0, 1.0, 4.0, 1.0, 0.0, 5.0, 9.0, 2.0];
        orthogonalize(&mut m, 4, 2, 0.0);
        let col = |c: usize| (0..4).map(|i| m[i * 2 + c]).collect::<Vec<f32>>();
        let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f32>();
        let (c0, c1) = (col(0), col(1));
        assert!((dot(&c0, &c0) - 1.0).abs() < 1e-6);
        assert!((dot(&c1, &c1) - 1.0).abs() < 1e-6);
        assert!(dot(&c0, &c1).abs() < 1e-6);
        // The first column keeps its direction: (3, 4, 0, 9) / |.|.
        let n = (9.0f32 + 16.0 + 81.0).sqrt();
        assert!((c0[0] - 3.0 / n).abs() < 1e-6 && (c0[3] - 9.0 / n).abs() < 1e-6);
        // A zero column stays zero instead of becoming NaN.
        let mut z = vec![0.0f32; 3];
        orthogonalize(&mut z, 3, 1, 0.0);
        assert_eq!(z, [0.0; 3]);
    }
}
