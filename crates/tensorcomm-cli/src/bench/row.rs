//! One line of benchmark results (nccl-tests columns) and its printers,
//! shared by every backend.

/// The result of one size of one benchmark.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Bytes per rank.
    pub size: usize,
    /// Elements per rank.
    pub count: usize,
    pub dtype: String,
    pub op: String,
    /// Mean time of one collective, the slowest rank's, in microseconds.
    pub time_us: f64,
    /// `size / time`, GB/s.
    pub algbw: f64,
    /// `algbw` times the op's bus factor (nccl-tests), GB/s.
    pub busbw: f64,
    /// Whether every rank's result matched the independent reference.
    pub correct: bool,
}

/// nccl-tests' bus-bandwidth factor for `op` on `ranks` ranks.
pub fn bus_factor(op: &str, ranks: usize) -> f64 {
    let n = ranks as f64;
    match op {
        "all_reduce" | "all_reduce_coalesced" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "all_to_all" => (n - 1.0) / n,
        "all_gather_into_tensor" | "all_gather_coalesced" => (n - 1.0) / n,
        "reduce_scatter_tensor" | "all_to_all_single" => (n - 1.0) / n,
        _ => 1.0,
    }
}

impl Row {
    /// Fills in the bandwidth columns from size, time, op and ranks.
    pub fn new(
        size: usize,
        count: usize,
        dtype: &str,
        op: &str,
        ranks: usize,
        time_us: f64,
        correct: bool,
    ) -> Self {
        let algbw = if time_us > 0.0 {
            size as f64 / (time_us * 1e3)
        } else {
            0.0
        };
        Row {
            size,
            count,
            dtype: dtype.into(),
            op: op.into(),
            time_us,
            algbw,
            busbw: algbw * bus_factor(op, ranks),
            correct,
        }
    }

    /// The header line of the text table.
    pub fn header() -> String {
        format!(
            "{:>12} {:>12} {:>6} {:>12} {:>12} {:>10} {:>10} {:>8}",
            "size(B)", "count", "type", "op", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "check"
        )
    }

    /// The row as a line of the text table.
    pub fn text(&self) -> String {
        format!(
            "{:>12} {:>12} {:>6} {:>12} {:>12.1} {:>10.3} {:>10.3} {:>8}",
            self.size,
            self.count,
            self.dtype,
            self.op,
            self.time_us,
            self.algbw,
            self.busbw,
            if self.correct { "OK" } else { "WRONG" }
        )
    }

    /// The row as one JSON object.
    pub fn json(&self) -> String {
        serde_json::json!({
            "size": self.size,
            "count": self.count,
            "dtype": self.dtype,
            "op": self.op,
            "time_us": self.time_us,
            "algbw_gbps": self.algbw,
            "busbw_gbps": self.busbw,
            "correct": self.correct,
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidths_follow_the_nccl_tests_formulas() {
        // 1 MB in 100 us = 10 GB/s; all_reduce on 4 ranks: x 1.5.
        let row = Row::new(1_000_000, 250_000, "f32", "all_reduce", 4, 100.0, true);
        assert!((row.algbw - 10.0).abs() < 1e-9);
        assert!((row.busbw - 15.0).abs() < 1e-9);
        let b = Row::new(1_000_000, 250_000, "f32", "broadcast", 4, 100.0, true);
        assert!((b.busbw - 10.0).abs() < 1e-9);
        assert!(row.text().contains("OK") && row.text().contains("15.000"));
        let v: serde_json::Value = serde_json::from_str(&row.json()).unwrap();
        assert_eq!(v["size"], 1_000_000);
        assert_eq!(v["correct"], true);
        assert!(Row::header().contains("busbw"));
    }
}
