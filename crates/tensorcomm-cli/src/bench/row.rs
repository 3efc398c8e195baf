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
        // Only (n - 1) / n of the buffer leaves (or reaches) the root.
        "gather" | "scatter" => (n - 1.0) / n,
        // Every rank sends its whole buffer once and receives one.
        "send_recv" | "send_recv_any" => 1.0,
        // Size 0: both bandwidths are 0 whatever the factor.
        "barrier" | "monitored_barrier" => 1.0,
        // Each rank's entries go to every other rank (an all-gather of
        // values of `size` bytes per rank): every rank receives
        // (n - 1) * size bytes of values (indices not counted).
        "all_reduce_sparse" => n - 1.0,
        _ => 1.0,
    }
}

/// The closing line of a text table, as nccl-tests prints it: the mean of
/// the rows' bus bandwidths, GB/s.
pub fn summary(busbw: &[f64]) -> String {
    let mean = if busbw.is_empty() {
        0.0
    } else {
        busbw.iter().sum::<f64>() / busbw.len() as f64
    };
    format!("# Avg bus bandwidth    : {mean:.4}")
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
            "{:>12} {:>12} {:>6} {:>25} {:>12} {:>11} {:>11} {:>8}",
            "size(B)", "count", "type", "op", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "check"
        )
    }

    /// The row as a line of the text table.
    pub fn text(&self) -> String {
        format!(
            "{:>12} {:>12} {:>6} {:>25} {:>12.1} {:>11.3} {:>11.3} {:>8}",
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

    /// [`header`](Row::header) with a baseline's time and the ratio.
    pub fn header_vs(baseline: &str) -> String {
        format!(
            "{} {:>12} {:>7}",
            Row::header(),
            format!("{baseline}(us)"),
            "ratio"
        )
    }

    /// [`text`](Row::text) with the baseline's time for the same case
    /// (`-` when unknown) and `time / baseline` (lower is better).
    pub fn text_vs(&self, baseline_us: Option<f64>) -> String {
        let (base, ratio) = match baseline_us {
            Some(b) if b > 0.0 => (format!("{b:.1}"), format!("{:.2}x", self.time_us / b)),
            _ => ("-".into(), "-".into()),
        };
        format!("{} {base:>12} {ratio:>7}", self.text())
    }

    /// [`json`](Row::json) with `baseline_us` and `ratio` (null when unknown).
    pub fn json_vs(&self, baseline_us: Option<f64>) -> String {
        let mut v = self.json_value();
        v["baseline_us"] = serde_json::json!(baseline_us);
        v["ratio"] = serde_json::json!(baseline_us.filter(|b| *b > 0.0).map(|b| self.time_us / b));
        v.to_string()
    }

    /// [`json`](Row::json) with extra fields (e.g. the host time per call).
    pub fn json_with(&self, extra: &[(&str, serde_json::Value)]) -> String {
        let mut v = self.json_value();
        for (k, x) in extra {
            v[*k] = x.clone();
        }
        v.to_string()
    }

    /// The row as one JSON object.
    pub fn json(&self) -> String {
        self.json_value().to_string()
    }

    fn json_value(&self) -> serde_json::Value {
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
        // gather and scatter: only the other ranks' pieces cross.
        let g = Row::new(1_000_000, 250_000, "f32", "scatter", 2, 100.0, true);
        assert!((g.busbw - 5.0).abs() < 1e-9);
        let p = Row::new(1_000_000, 250_000, "f32", "send_recv_any", 4, 100.0, true);
        assert!((p.busbw - 10.0).abs() < 1e-9);
        let s = Row::new(
            1_000_000,
            250_000,
            "f32",
            "all_reduce_sparse",
            4,
            100.0,
            true,
        );
        assert!((s.busbw - 30.0).abs() < 1e-9);
        // Barriers: size 0, so no bandwidth.
        let b = Row::new(0, 0, "f32", "barrier", 4, 12.0, true);
        assert_eq!((b.algbw, b.busbw), (0.0, 0.0));
    }

    #[test]
    fn baseline_columns_give_the_ratio() {
        let row = Row::new(1024, 256, "f32", "broadcast_coalesced/25MiB", 2, 10.0, true);
        let line = row.text_vs(Some(40.0));
        assert!(line.ends_with("40.0   0.25x"), "{line:?}");
        assert!(line.contains(" broadcast_coalesced/25MiB "), "{line:?}");
        assert!(row.text_vs(None).ends_with("-       -"));
        assert_eq!(
            Row::header_vs("torch").len(),
            row.text_vs(Some(40.0)).len(),
            "columns line up"
        );
        let v: serde_json::Value = serde_json::from_str(&row.json_vs(Some(40.0))).unwrap();
        assert_eq!(v["ratio"], 0.25);
        let v: serde_json::Value = serde_json::from_str(&row.json_vs(None)).unwrap();
        assert!(v["ratio"].is_null());
    }
}
