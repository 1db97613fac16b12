"""Truth scoring of search_efficiency (bench/search_efficiency.cc), ported for the peers.

A strategy's recommended configurations are scored by their true (noise-free) values: the
hypervolume of those values, objectives min-max scaled by the true values of the whole space and
reference point 1.1 in each scaled objective, over the same hypervolume of the true exhaustive
front. The arithmetic follows kareus::pareto_front, kareus::hypervolume_2d and
kareus::normalized_hypervolume (src/pareto/pareto.cc, src/search/strategies.cc) operation for
operation, so the two scorers agree to rounding; `check` shows it on random search, whose order
search_efficiency --dump-spaces writes. Standard library only: the ctest check runs without
optuna or botorch.
"""

import json
import math
from pathlib import Path


def pareto_front(pts):
    """Indices of the non-dominated points, by time ascending (kareus::pareto_front)."""
    idx = sorted(range(len(pts)), key=lambda i: (pts[i][0], pts[i][1]))  # stable, as C++
    out, best_y = [], 0.0
    for i in idx:
        if not out or pts[i][1] < best_y:
            out.append(i)
            best_y = pts[i][1]
    return out


def hypervolume_2d(pts, ref):
    inside = [p for p in pts if p[0] < ref[0] and p[1] < ref[1]]
    hv, prev_y = 0.0, ref[1]
    for i in pareto_front(inside):
        hv += (ref[0] - inside[i][0]) * (prev_y - inside[i][1])
        prev_y = inside[i][1]
    return hv


def normalized_hypervolume(pts, lo, hi):
    sx = hi[0] - lo[0] if hi[0] > lo[0] else 1.0
    sy = hi[1] - lo[1] if hi[1] > lo[1] else 1.0
    return hypervolume_2d([((x - lo[0]) / sx, (y - lo[1]) / sy) for x, y in pts], (1.1, 1.1))


class TruthScorer:
    """Scores sets of configuration indices of one dumped partition by truth."""

    def __init__(self, dump):
        self.true = [tuple(q) for q in dump["true"]]
        xs = [q[0] for q in self.true]
        ys = [q[1] for q in self.true]
        # Accumulated as the C++ does (min/max from +-1e300): the same lo and hi.
        self.lo = (min([1e300] + xs), min([1e300] + ys))
        self.hi = (max([-1e300] + xs), max([-1e300] + ys))
        self.hv_true = normalized_hypervolume(self.true, self.lo, self.hi)

    def score(self, idx):
        return normalized_hypervolume([self.true[i] for i in idx], self.lo, self.hi) / self.hv_true

    def score_measured_front(self, measured_idx, measured_values):
        """A strategy without a model recommends the Pareto set of its own noisy measurements."""
        front = pareto_front(measured_values)
        return self.score([measured_idx[i] for i in front])


def load_dumps(spaces_dir):
    return {d["partition"]: d for d in
            (json.loads(p.read_text()) for p in sorted(Path(spaces_dir).glob("*.json")))}


def check(spaces_dir, cpp_json, tol=1e-9):
    """Random search's C++ truth scores against this scorer's, on every dumped partition and
    seed. Returns (compared, worst |difference|)."""
    cpp = {p["partition"]: p for p in json.loads(Path(cpp_json).read_text())["partitions"]}
    compared, worst = 0, 0.0
    for label, dump in load_dumps(spaces_dir).items():
        scorer = TruthScorer(dump)
        for seed, sd in dump["seeds"].items():
            order = sd["random_order"]
            for b, cell in cpp[label]["random"].items():
                n = min(int(b), len(order))
                got = scorer.score_measured_front(order[:n], [sd["measured"][i] for i in order[:n]])
                want = cell["truth"][int(seed) - 1]
                if not math.isfinite(got) or abs(got - want) > tol:
                    raise AssertionError(f"{label} seed {seed} budget {b}: python {got!r}, "
                                         f"C++ {want!r}")
                worst = max(worst, abs(got - want))
                compared += 1
    if compared == 0:
        raise AssertionError(f"nothing compared: no dumps in {spaces_dir}?")
    return compared, worst


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3:
        sys.exit("usage: peer_scoring.py SPACES_DIR CPP_JSON  (search_efficiency --dump-spaces "
                 "SPACES_DIR --json CPP_JSON)")
    n, worst = check(sys.argv[1], sys.argv[2])
    print(f"scorers agree: {n} (partition, seed, budget) scores of random search, "
          f"max |python - C++| = {worst:.3g}")
