//! Seeded standard normal numbers, the same on every rank for the same
//! seed (PowerSGD's random initial `Q`): SplitMix64 draws, turned into
//! normals by the Box-Muller transform.

/// SplitMix64: a small, fast generator whose whole state is one `u64`.
#[derive(Clone, Debug)]
pub(super) struct SplitMix64(u64);

impl SplitMix64 {
    pub(super) fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: never 0, so its logarithm is finite.
    fn next_open_unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// `count` draws of the standard normal distribution.
    pub(super) fn normals(&mut self, count: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(count + 1);
        while out.len() < count {
            let radius = (-2.0 * self.next_open_unit().ln()).sqrt();
            let angle = std::f64::consts::TAU * self.next_open_unit();
            out.push((radius * angle.cos()) as f32);
            out.push((radius * angle.sin()) as f32);
        }
        out.truncate(count);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normals_are_reproducible_and_standard() {
        let a = SplitMix64::new(7).normals(20_001);
        assert_eq!(a, SplitMix64::new(7).normals(20_001));
        assert_ne!(a[..10], SplitMix64::new(8).normals(10)[..]);
        let mean = a.iter().map(|&x| f64::from(x)).sum::<f64>() / a.len() as f64;
        let var = a
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / a.len() as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "variance {var}");
    }
}
