#!/usr/bin/env python3
"""Every comparison script's output starts with a `#` line naming the op,
its reduce op, the dtype and how each side was timed (no torch, no GPU and
no tensorcomm binary needed: the runs are replaced by empty results):
    python3 bench/test_bench_headers.py"""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_ddp  # noqa: E402
import compare_gloo  # noqa: E402
import compare_intranode  # noqa: E402
import compare_nccl  # noqa: E402
import ratio_table  # noqa: E402


def first_line(main, argv):
    """The first line `main` prints with `argv` as its arguments."""
    out = io.StringIO()
    with mock.patch.object(sys, "argv", ["script"] + argv), contextlib.redirect_stdout(out):
        try:
            main()
        except SystemExit:
            pass
    return out.getvalue().lstrip("\n").splitlines()[0]


class Headers(unittest.TestCase):
    def test_compare_intranode_names_all_reduce_sum_dtype_and_timing_first(self):
        with mock.patch.object(compare_intranode, "run", return_value=([], "", True)):
            line = first_line(compare_intranode.main, ["--ranks", "4", "--dtype", "f16"])
        self.assertTrue(line.startswith("# all_reduce, reduce op SUM, 4 ranks, f16; "), line)
        self.assertIn("median", line)
        self.assertIn("CUDA events", line)
        self.assertIn("CUDA graph", line)

    def test_compare_nccl_names_each_op_its_reduce_op_dtype_and_timing(self):
        with mock.patch.object(compare_nccl, "run", return_value=({}, True)):
            line = first_line(compare_nccl.main, ["--ops", "reduce_scatter_tensor,broadcast",
                                                  "--dtype", "bf16"])
        self.assertTrue(line.startswith("# reduce_scatter_tensor, 1 rank(s), bf16, reduce op SUM; "),
                        line)
        self.assertIn("median of 50 calls after 10 warm-up", line)
        self.assertIn("no reduce op", compare_nccl.title("broadcast", 2, "f32", 5, 1))

    def test_compare_ddp_names_the_hook_s_reduce_op_dtype_and_timing(self):
        with mock.patch.object(compare_ddp, "run", return_value=None):
            line = first_line(compare_ddp.main, ["--steps", "7"])
        self.assertTrue(line.startswith("# DDP gradient all-reduce, reduce op SUM"), line)
        self.assertIn("f32", line)
        self.assertIn("median of 7 steps after 3 warm-up", line)

    def test_compare_gloo_names_op_reduce_op_dtype_and_timing(self):
        with mock.patch.object(compare_gloo, "run", return_value=([], None)):
            line = first_line(lambda: sys.exit(compare_gloo.main(sys.argv[1:])),
                              ["--ops", "reduce", "--ranks", "2", "--dtype", "i32"])
        self.assertEqual(line, "# reduce, 2 ranks, i32, reduce op SUM; " + compare_gloo.timing("cpu"))

    def test_ratio_table_names_what_its_rows_record(self):
        rows = [
            {"tool": "tensorcomm", "op": "all_reduce", "dtype": "bf16", "ranks": 2,
             "transport": "shm", "size": 8, "time_us": 5.0, "device": "cuda"},
            {"tool": "gloo", "op": "all_reduce", "dtype": "bf16", "ranks": 2, "size": 8,
             "time_us": 50.0, "device": "cuda"},
        ]
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        try:
            out = io.StringIO()
            with mock.patch.object(sys, "argv", ["ratio_table.py", f.name]), \
                    contextlib.redirect_stdout(out):
                ratio_table.main()
        finally:
            os.unlink(f.name)
        lines = out.getvalue().splitlines()
        self.assertEqual(lines[0], "# all_reduce, bf16, reduce op SUM; ratio = tensorcomm time / "
                         "Gloo time per size, range over the runs; CUDA tensors; "
                         + compare_gloo.timing("cuda"))
        self.assertEqual(lines[3], "| 2 | shm | 0.10 | - | - | - |")
        # Files written before compare_gloo.py recorded the device say so.
        old = [dict(r) for r in rows]
        for r in old:
            del r["device"]
        self.assertIn("device not recorded", ratio_table.header("all_reduce", old))
        self.assertIn("no reduce op", ratio_table.header("broadcast", old))


if __name__ == "__main__":
    unittest.main()
