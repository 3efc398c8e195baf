#!/usr/bin/env python3
"""Tests of compare_gloo.py's parsing and table (no torch needed):
    python3 bench/test_compare_gloo.py
With TENSORCOMM_BIN=path/to/tensorcomm it also runs the tensorcomm half."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_gloo  # noqa: E402

TC = """# tensorcomm bench: header
[rank0]: {"size": 8, "count": 2, "time_us": 6.0, "correct": true, "op": "all_reduce"}
{"size": 64, "count": 16, "time_us": 12.5, "correct": true}
{"size": "bad", "time_us": 1}
{not json
[1, 2]
"""
GLOO = """Warning: something from torch
{"backend": "gloo", "op": "all_reduce", "ranks": 2, "size_bytes": 8, "time_us": 150.0}
{"backend": "gloo", "size_bytes": 64, "time_us": 125}
"""


class ParseAndTable(unittest.TestCase):
    def test_rows_are_found_among_other_output_and_prefixes(self):
        rows = compare_gloo.parse_rows(TC)
        self.assertEqual([(r["size"], r["time_us"]) for r in rows], [(8, 6.0), (64, 12.5)])
        gloo = compare_gloo.parse_rows(GLOO)
        self.assertEqual([(r["size"], r["time_us"]) for r in gloo], [(8, 150.0), (64, 125.0)])

    def test_table_puts_ratios_side_by_side_and_marks_missing_cells(self):
        tc = compare_gloo.parse_rows(TC)
        gloo = compare_gloo.parse_rows(GLOO)[:1]
        text = compare_gloo.table("all_reduce", 2, ["shm"], {"shm": tc}, gloo)
        lines = text.splitlines()
        self.assertEqual(
            lines[0],
            "# all_reduce, 2 ranks, f32, reduce op SUM; time: mean call after warm-up, "
            "slowest rank, in both (tensorcomm bench, gloo_bench.py)")
        cuda = compare_gloo.table("broadcast", 2, ["shm"], {"shm": tc}, gloo, "bf16", "cuda")
        self.assertTrue(cuda.startswith("# broadcast, 2 ranks, bf16, no reduce op; time: "
                                        "tensorcomm = median call"), cuda)
        self.assertEqual(lines[2].split(), ["8", "6.0", "150.0", "0.040", "OK"])
        self.assertEqual(lines[3].split(), ["64", "12.5", "-", "-", "OK"])

    def test_barrier_rows_of_size_zero_pair_up(self):
        tc = compare_gloo.parse_rows(
            '{"size": 0, "count": 0, "op": "barrier", "time_us": 5.0, "correct": true}')
        gloo = compare_gloo.parse_rows(
            '{"backend": "gloo", "op": "barrier", "size_bytes": 0, "count": 0, "time_us": 100.0}')
        lines = compare_gloo.table("barrier", 4, ["shm"], {"shm": tc}, gloo).splitlines()
        self.assertEqual(len(lines), 3)
        self.assertEqual(lines[2].split(), ["0", "5.0", "100.0", "0.050", "OK"])

    def test_sizes_parse_like_the_bench(self):
        self.assertEqual(compare_gloo.parse_size("64M"), 64 << 20)
        self.assertEqual(compare_gloo.parse_size("8"), 8)

    def test_device_cuda_passes_the_device_and_picks_the_cuda_script(self):
        class Args:
            tensorcomm, python, gloo_script, device, peer_memory = "tc", "py", None, "cuda", False
            begin, end, factor, dtype, iters, warmup = "8", "64", 2, "f32", 5, 1
        tc = compare_gloo.tensorcomm_cmd(Args, "all_reduce", 2, "shm")
        self.assertEqual(tc[tc.index("--device") + 1], "cuda")
        # Gloo's column is a median call: so is tensorcomm's.
        self.assertIn("--median", tc)
        self.assertTrue(compare_gloo.gloo_cmd(Args, "all_reduce", 2)[1].endswith(
            "gloo_cuda_torch.py"))
        Args.device = "cpu"
        self.assertTrue(compare_gloo.gloo_cmd(Args, "all_reduce", 2)[1].endswith("gloo_bench.py"))
        self.assertNotIn("--median", compare_gloo.tensorcomm_cmd(Args, "all_reduce", 2, "shm"))

    @unittest.skipUnless(os.environ.get("TENSORCOMM_BIN"), "set TENSORCOMM_BIN to run")
    def test_the_tensorcomm_half_runs(self):
        out = "/tmp/compare_gloo_test.jsonl"
        code = compare_gloo.main(["--tensorcomm", os.environ["TENSORCOMM_BIN"], "--no-gloo",
                                  "--ranks", "2", "-b", "8", "-e", "64", "-f", "8",
                                  "--iters", "5", "--json-out", out])
        self.assertEqual(code, 0)
        with open(out) as f:
            rows = compare_gloo.parse_rows(f.read())
        self.assertEqual(sorted((r["transport"], r["size"]) for r in rows),
                         [("shm", 8), ("shm", 64), ("tcp", 8), ("tcp", 64)])


if __name__ == "__main__":
    unittest.main()
