#!/usr/bin/env python3
"""Checks of bench/convergence.sh's judge and floor on fake runs (ctest: ConvergenceReport): a variant within
its tolerance passes, one outside fails, a failed run is ERROR with soltrain's line while the others are still
judged, a variant without its baseline says so, the SVGs are well-formed, and the floor is the closed form."""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest
import xml.dom.minidom

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
sys.path.insert(0, BENCH)
import markov_task  # noqa: E402
import task_floor  # noqa: E402

VARIANTS = """# name start baseline within settings
a     init  -  -   optimizer=adamw_torch
b     init  a  1%  optimizer=adamw_8bit
c     init  a  2%  recipe=fp8-hybrid
d     init  a  1%  x=1
l     base  -  -   lora=true
q     base  l  3%  lora=true qlora_nf4=true
"""


def fake_run(out, name, rc, evals=(), log="", train=()):
    runs = os.path.join(out, "runs")
    os.makedirs(os.path.join(runs, name), exist_ok=True)
    with open(os.path.join(runs, name + ".rc"), "w") as f:
        f.write(f"{rc}\n")
    with open(os.path.join(runs, name + ".log"), "w") as f:
        f.write(log)
    with open(os.path.join(runs, name, "metrics.jsonl"), "w") as f:
        for step, loss in train:
            f.write(json.dumps({"step": step, "loss": loss, "lr": 1e-3}) + "\n")
        for step, loss in evals:
            f.write(json.dumps({"step": step, "eval_loss": loss, "eval_tokens": 100}) + "\n")


class Report(unittest.TestCase):
    def run_report(self, out):
        with open(os.path.join(out, "variants.txt"), "w") as f:
            f.write(VARIANTS)
        p = subprocess.run([sys.executable, os.path.join(BENCH, "convergence_report.py"), "report", out,
                            os.path.join(out, "variants.txt"), "--floor", "0.5"], capture_output=True, text=True)
        rows = {}
        for line in p.stdout.splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 9 and cells[0] not in ("variant", "---"):
                rows[cells[0]] = cells
        return p, rows

    def test_judgement(self):
        with tempfile.TemporaryDirectory() as out:
            fake_run(out, "a", 0, [(0, 5.0), (100, 1.000)], train=[(1, 5.0), (100, 1.1)])
            fake_run(out, "b", 0, [(0, 5.0), (100, 1.009)])  # +0.9%: within 1%
            fake_run(out, "c", 2, log="step 1\nerror: recipe: \"fp8-hybrid\": not built yet\n")
            fake_run(out, "d", 0, [(0, 5.0), (100, 0.985)])  # -1.5%: outside 1% (better counts too)
            fake_run(out, "l", 1, log="boom\n")
            fake_run(out, "q", 0, [(0, 5.0), (100, 1.0)])
            p, rows = self.run_report(out)
            self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
            self.assertEqual(rows["a"][7], "-")
            self.assertEqual((rows["b"][5], rows["b"][7]), ("+0.90%", "PASS"))
            self.assertEqual(rows["c"][7], "ERROR")
            self.assertIn('exit 2: error: recipe: "fp8-hybrid": not built yet', rows["c"][8])
            self.assertEqual((rows["d"][5], rows["d"][7]), ("-1.50%", "FAIL"))
            self.assertEqual(rows["q"][7], "NO BASELINE")
            self.assertEqual(rows["a"][4], "1.1000")  # the last train loss
            svgs = sorted(f for f in os.listdir(out) if f.endswith(".svg"))
            self.assertEqual(svgs, ["a_vs_b_d.svg", "a_vs_c.svg", "l_vs_q.svg"])
            for s in svgs:
                xml.dom.minidom.parse(os.path.join(out, s))
            with open(os.path.join(out, "summary.md")) as f:
                self.assertIn("![a_vs_c.svg](a_vs_c.svg)", f.read())

    def test_all_pass_is_exit_0(self):
        with tempfile.TemporaryDirectory() as out:
            for name, loss in (("a", 1.0), ("b", 1.005), ("c", 0.99), ("d", 1.0), ("l", 2.0), ("q", 2.05)):
                fake_run(out, name, 0, [(0, 5.0), (50, loss)])
            p, rows = self.run_report(out)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertEqual([rows[n][7] for n in "bcdq"], ["PASS"] * 4)

    def test_seeds_judged_on_the_means(self):
        with tempfile.TemporaryDirectory() as out:
            with open(os.path.join(out, "variants.txt"), "w") as f:
                f.write("a init - - x=1\nb init a 1% y=1\nc init a 1% z=1\n")
            for seed, (la, lb, lc) in ((1, (1.00, 1.02, 1.0)), (2, (1.02, 1.00, 1.1))):
                fake_run(out, f"a-s{seed}", 0, [(0, 5.0), (100, la)], train=[(1, 5.0), (100, la + 0.1)])
                fake_run(out, f"b-s{seed}", 0, [(0, 5.0), (100, lb)])
                fake_run(out, f"c-s{seed}", 0 if seed == 1 else 3, [(0, 5.0), (100, lc)], log="boom\n")
            p = subprocess.run([sys.executable, os.path.join(BENCH, "convergence_report.py"), "report", out,
                                os.path.join(out, "variants.txt"), "--floor", "0.5", "--seeds", "1,2"],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 1, p.stdout + p.stderr)  # c: its seed 2 failed
            rows = {}
            for line in p.stdout.splitlines():
                cells = [c.strip() for c in line.strip("|").split("|")]
                if len(cells) == 11 and cells[0] not in ("variant", "---"):
                    rows[cells[0]] = cells
            self.assertEqual(rows["a"][2:5], ["1.0100", "1.0000 / 1.0200", "1.98%"])
            self.assertEqual((rows["b"][7], rows["b"][9]), ("+0.00%", "PASS"))  # the means are equal
            self.assertEqual(rows["c"][9], "ERROR")
            self.assertIn("seed 2: exit 3: boom", rows["c"][10])
            self.assertIn("Seed spread of the baselines (max - min over the seeds, of the mean): a 1.98%", p.stdout)
            with open(os.path.join(out, "mean", "a", "metrics.jsonl")) as f:
                mean = [json.loads(l) for l in f]
            self.assertIn({"step": 100, "eval_loss": 1.01}, mean)
            self.assertIn({"step": 100, "loss": 1.11}, mean)
            xml.dom.minidom.parse(os.path.join(out, "a_vs_b_c.svg"))

    def test_bad_variants_file_is_one_line_exit_2(self):
        with tempfile.TemporaryDirectory() as out:
            path = os.path.join(out, "v.txt")
            with open(path, "w") as f:
                f.write("a init - -\nb init z 1% x=1\n")
            p = subprocess.run([sys.executable, os.path.join(BENCH, "convergence_report.py"), "plan", path],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 2)
            self.assertEqual(p.stderr.strip(), f"convergence_report.py: {path}:2: baseline z is not a variant "
                                                "listed above this line")


class Floor(unittest.TestCase):
    def test_closed_form(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "v.jsonl")
            recs = [("abc", "cba"), ("abcd", "zzzz")]  # one clean, one noisy
            with open(path, "w") as f:
                for w, a in recs:
                    f.write(json.dumps({"messages": [{"role": "user", "content": w},
                                                     {"role": "assistant", "content": a}]}) + "\n")
            p = 0.2
            want = (-math.log(0.8 + 0.2 * 26.0**-3) - math.log(0.2 * 26.0**-4)) / (4 + 5)
            got, counted = task_floor.floor(path, p)
            self.assertEqual(counted, 9)
            self.assertAlmostEqual(got, want, places=12)
            self.assertAlmostEqual(task_floor.floor(path, p, tokens=18)[0], want / 2, places=12)


class MarkovFloor(unittest.TestCase):
    def test_as_soltrain_counts(self):
        # Order 1 over 3 letters, documents cut at 4 tokens: the first letter is no target, the eos is one
        # unless the document was cut (4 letters: soltrain keeps 4 tokens, the appended eos goes).
        chain = markov_task.make_chain(3, 1, 0.5, 4.0, 4, seed=3)
        rows, q = chain["rows"], 0.25
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "v.jsonl")
            with open(path, "w") as f:
                for doc in ("ab", "abca", "c"):
                    f.write(json.dumps({"text": doc}) + "\n")
            p = lambda ctx, letter: 0.75 * rows[ctx]["abc".index(letter)]
            want = -(math.log(p("a", "b")) + math.log(q)  # ab<eos>
                     + math.log(p("a", "b")) + math.log(p("b", "c")) + math.log(p("c", "a"))  # abca, cut
                     + math.log(q)) / 6  # c<eos>
            got, counted, docs = markov_task.floor(chain, path)
            self.assertEqual((counted, docs), (6, 3))
            self.assertAlmostEqual(got, want, places=12)
            self.assertAlmostEqual(markov_task.lm_score(chain, path)[0], want, places=12)

    def test_generated_file_meets_the_entropy_rate(self):
        chain = markov_task.make_chain(26, 2, 0.1, 50.0, 64, seed=1)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.jsonl")
            import random
            markov_task.write_jsonl(path, markov_task.generate_docs(chain, random.Random(5), tokens=60000))
            got, counted, _ = markov_task.floor(chain, path)
            self.assertGreaterEqual(counted, 55000)
            # The sample mean of ~60k targets of sd ~1.3 nats: 4 sd is 0.02.
            self.assertAlmostEqual(got, markov_task.entropy_rate(chain), delta=0.03)


if __name__ == "__main__":
    unittest.main()
