#!/usr/bin/env python3
"""mbo against Bayesian-optimization peers, scored by the same truth as search_efficiency.

Peers: Optuna's NSGA-II (Deb et al., IEEE TEVC 2002) and multi-objective TPE (Ozaki et al., GECCO
2020 / JAIR 2022), and BoTorch's qLogNEHVI (Daulton, Balandat, Bakshy, NeurIPS 2021; the log form
of Ament et al., NeurIPS 2023, which BoTorch recommends over plain qNEHVI). Each runs on the
spaces `search_efficiency --dump-spaces DIR` writes: for seed s a configuration is "measured" by
looking up the emulator's noisy value for seed s, the value mbo and random search got for it (the
emulator's noise is a pure function of seed, partition and configuration). A peer's
recommendation at budget b is the Pareto set of its first b distinct measurements, scored by
truth with bench/peer_scoring.py (the C++ formula). Each peer runs once with the largest budget
and smaller budgets are prefixes, as in search_efficiency: Optuna's samplers do not look at
n_trials, and qLogNEHVI's schedule is 28 Sobol points, then batches of 28 (mbo's schedule until
2026-12-03; mbo now refits every 7 points after 21, which would cost qLogNEHVI four times the GP
fits, minutes each on this machine).

Duplicates: Optuna's samplers propose configurations already measured. Such a trial is told the
cached value (the sampler sees a completed trial, as an Optuna user who caches would do) and is
not counted against the budget: the budget counts distinct measurements, as mbo's does. A run
that proposes only duplicates for 20 x budget trials stops with fewer points; `distinct` in the
output says how many it measured.

Usage (one run per peer group, then the tables of their outputs merged):
  .venv-bench/bin/python bench/search_peers.py --spaces DIR --out OUT.json --peers nsga2,tpe
      [--seeds N] [--first-seed N] [--per-class N] [--mc-samples N] [--candidates N]
      [--filter S[,S...]]
  .venv-bench/bin/python bench/search_peers.py --spaces DIR --out A.json,B.json
      --cpp-json CPP.json --table TABLE.md
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_scoring import TruthScorer, load_dumps  # noqa: E402

BUDGETS = [28, 56, 112, 224]
BATCH = 28  # qLogNEHVI's initial design and batch (mbo's 28 + 28 before 2026-12-03)
TRIAL_CAP = 2  # Optuna: at most this many trials per counted (distinct) measurement


class Oracle:
    """The dumped space for one seed: measure(index) -> noisy (time_s, energy_j), cached."""

    def __init__(self, dump, seed):
        self.dump = dump
        self.values = dump["seeds"][str(seed)]["measured"]
        self.reset()

    def measure(self, i):
        if i not in self._seen:
            self._seen.add(i)
            self.order.append(i)
        return self.values[i]

    def reset(self):
        self.order, self._seen = [], set()  # distinct indices in measurement order
        return self


def index_of(dump):
    return {(c[0], c[1], c[2]): i for i, c in enumerate(dump["configs"])}


def run_optuna(dump, seed, sampler_name, budget):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sp = dump["space"]
    freqs, sms, slots = sp["freqs_mhz"], sp["sms"], sp["slots"]
    freqs_sorted, sms_sorted = sorted(freqs), sorted(sms)
    where = index_of(dump)
    oracle = Oracle(dump, seed)
    if sampler_name == "nsga2":
        sampler = optuna.samplers.NSGAIISampler(seed=seed)
    else:
        sampler = optuna.samplers.TPESampler(seed=seed)
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    trials = 0
    while len(oracle.order) < budget and trials < TRIAL_CAP * budget:
        trial = study.ask()
        # Ordered knobs as integer indices (the sampler may use their order), the slot as a
        # category.
        f = freqs_sorted[trial.suggest_int("freq_idx", 0, len(freqs_sorted) - 1)]
        s = sms_sorted[trial.suggest_int("sms_idx", 0, len(sms_sorted) - 1)]
        slot = trial.suggest_categorical("slot", slots)
        t, e = oracle.measure(where[(f, s, slot)])
        study.tell(trial, [t, e])
        trials += 1
    return oracle.order, {"trials": trials}


def features(dump):
    """Normalized features: clock and SMs scaled to [0, 1], the slot one-hot."""
    import torch

    sp = dump["space"]
    f_lo, f_hi = min(sp["freqs_mhz"]), max(sp["freqs_mhz"])
    s_lo, s_hi = min(sp["sms"]), max(sp["sms"])
    slots = sp["slots"]
    rows = []
    for f, s, slot in dump["configs"]:
        row = [(f - f_lo) / max(f_hi - f_lo, 1), (s - s_lo) / max(s_hi - s_lo, 1)]
        row += [1.0 if slot == name else 0.0 for name in slots]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.double)


def run_qnehvi(dump, seed, budget, mc_samples, max_candidates):
    import torch
    from botorch.acquisition.multi_objective.logei import (
        qLogNoisyExpectedHypervolumeImprovement,
    )
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from botorch.models.transforms.outcome import Standardize
    from botorch.optim import optimize_acqf_discrete
    from botorch.sampling import SobolQMCNormalSampler
    from gpytorch.mlls import ExactMarginalLogLikelihood

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    X_all = features(dump)
    n = X_all.shape[0]
    oracle = Oracle(dump, seed)
    # Initial design: 28 distinct configurations from scrambled Sobol points, each snapped to the
    # nearest unmeasured configuration.
    sobol = torch.quasirandom.SobolEngine(dimension=X_all.shape[1], scramble=True, seed=seed)
    taken = torch.zeros(n, dtype=torch.bool)
    for u in sobol.draw(BATCH).double():
        d = ((X_all - u) ** 2).sum(-1)
        d[taken] = float("inf")
        i = int(torch.argmin(d))
        taken[i] = True
        oracle.measure(i)
    fit_s = acq_s = 0.0
    while len(oracle.order) < budget:
        idx = torch.tensor(oracle.order)
        # Maximize the negated logs: both objectives are positive and span a few x.
        Y = -torch.log(torch.tensor([oracle.values[i] for i in oracle.order], dtype=torch.double))
        t0 = time.perf_counter()
        model = SingleTaskGP(X_all[idx], Y, outcome_transform=Standardize(m=2))
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
        t1 = time.perf_counter()
        ref = Y.min(0).values - 0.1 * (Y.max(0).values - Y.min(0).values)
        acq = qLogNoisyExpectedHypervolumeImprovement(
            model=model, ref_point=ref.tolist(), X_baseline=X_all[idx], prune_baseline=True,
            sampler=SobolQMCNormalSampler(sample_shape=torch.Size([mc_samples]), seed=seed))
        # The candidate set: every unmeasured configuration, or a seeded random subset of them
        # (the acquisition's cost is linear in it).
        free = torch.nonzero(~taken).squeeze(-1)
        if 0 < max_candidates < len(free):
            free = free[torch.randperm(len(free), generator=gen)[:max_candidates]]
        q = min(BATCH, budget - len(oracle.order))
        cand, _ = optimize_acqf_discrete(acq, q=q, choices=X_all[free], unique=True)
        acq_s += time.perf_counter() - t1
        fit_s += t1 - t0
        for x in cand:
            j = int(free[torch.nonzero((X_all[free] == x).all(-1))[0, 0]])
            taken[j] = True
            oracle.measure(j)
    return oracle.order, {"fit_s": fit_s, "acq_s": acq_s}


def run_peer(peer, dump, seed, budget, a):
    if peer in ("nsga2", "tpe"):
        return run_optuna(dump, seed, peer, budget)
    return run_qnehvi(dump, seed, budget, a.mc_samples, a.candidates)


NAMES = {"mbo": "mbo", "random": "random", "nsga2": "NSGA-II (Optuna)",
         "tpe": "TPE (Optuna)", "qnehvi": "qLogNEHVI (BoTorch)"}


def table(scores, strategies, pairs, classes, timing):
    """Markdown rows per class: mean over the (partition, seed) pairs (worst single run)."""
    head = "| class | partitions | runs | strategy | " + " | ".join(str(b) for b in BUDGETS)
    lines = [head + " | s/search |", "| --- | --- | --- | --- |" + " --- |" * (len(BUDGETS) + 1)]
    by_class = {}
    for label, seed in pairs:
        by_class.setdefault(classes[label], []).append((label, seed))
    by_class["all"] = list(pairs)
    for cls in sorted(by_class):
        ps = by_class[cls]
        for s in strategies:
            row = f"| {cls} | {len({p for p, _ in ps})} | {len(ps)} | {NAMES[s]} |"
            for b in BUDGETS:
                v = [scores[s][label][str(b)][seed - 1] for label, seed in ps]
                row += f" {sum(v) / len(v):.4f} ({min(v):.4f}) |"
            t = [timing[s][label][seed - 1] for label, seed in ps] if s in timing else []
            row += f" {sum(t) / len(t):.2f} |" if t else " |"
            lines.append(row)
    return "\n".join(lines)


def beats(scores, peers, pairs, classes):
    """(class, budget) cells where a peer's mean exceeds mbo's, with the margin."""
    out = []
    by_class = {}
    for label, seed in pairs:
        by_class.setdefault(classes[label], []).append((label, seed))
    by_class["all"] = list(pairs)
    for cls in sorted(by_class):
        for b in BUDGETS:
            def mean(s):
                v = [scores[s][label][str(b)][seed - 1] for label, seed in by_class[cls]]
                return sum(v) / len(v)
            for p in peers:
                if mean(p) > mean("mbo"):
                    out.append(f"{NAMES[p]} {cls} @{b} +{mean(p) - mean('mbo'):.4f}")
    return out


def run(a, dumps, classes):
    import torch

    torch.set_num_threads(1)  # a shared machine: one core per search
    peers = [p for p in a.peers.split(",") if p]
    scores, runs = {}, {}
    for peer in peers:
        labels = sorted(dumps)
        if a.per_class > 0:
            per = {}
            for label in labels:
                per.setdefault(classes[label], [])
                if len(per[classes[label]]) < a.per_class:
                    per[classes[label]].append(label)
            labels = sorted(lab for ls in per.values() for lab in ls)
        # Seed-major, so that a run stopped early has every partition at the first seeds.
        todo = [(label, seed) for seed in range(a.first_seed, a.seeds + 1) for label in labels]
        scores[peer], runs[peer] = {}, {}
        for k, (label, seed) in enumerate(todo):
            dump = dumps[label]
            scorer = TruthScorer(dump)
            w0, c0 = time.perf_counter(), time.process_time()
            order, info = run_peer(peer, dump, seed, BUDGETS[-1], a)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            vals = dump["seeds"][str(seed)]["measured"]
            cell = {}
            for b in BUDGETS:
                pre = order[:b]
                cell[str(b)] = scorer.score_measured_front(pre, [vals[i] for i in pre])
            scores[peer].setdefault(label, {})[str(seed)] = cell
            runs[peer].setdefault(label, {})[str(seed)] = dict(
                info, wall_s=wall, cpu_s=cpu, distinct=len(order))
            print(f"[{peer} {k + 1}/{len(todo)}] {label} seed {seed}: "
                  + " ".join(f"{b} {cell[str(b)]:.4f}" for b in BUDGETS)
                  + f" | {wall:.1f} s wall, {cpu:.1f} s CPU, {len(order)} distinct", flush=True)
            Path(a.out).write_text(json.dumps(
                {"budgets": BUDGETS, "options": vars(a), "scores": scores, "runs": runs},
                indent=1))


def tables(a, dumps, classes):
    """One table per peer group: each peer's completed (partition, seed) runs, with mbo and
    random (from the C++ JSON) on the same runs."""
    cpp = {p["partition"]: p for p in json.loads(Path(a.cpp_json).read_text())["partitions"]}
    scores = {"mbo": {}, "random": {}}
    for label in dumps:
        for s in ("mbo", "random"):
            scores[s][label] = {str(b): cpp[label][s][str(b)]["truth"] for b in BUDGETS}
    timing, pairs_of, opts = {}, {}, {}
    merged, merged_runs = {}, {}  # a peer's runs may be split over several files
    for f in a.out.split(","):
        d = json.loads(Path(f).read_text())
        for peer, by_label in d["scores"].items():
            for lab, v in by_label.items():
                merged.setdefault(peer, {}).setdefault(lab, {}).update(v)
                merged_runs.setdefault(peer, {}).setdefault(lab, {}).update(d["runs"][peer][lab])
    for peer, by_label in merged.items():
        nseeds = max(int(s) for v in by_label.values() for s in v)
        scores[peer] = {lab: {str(b): [v.get(str(s), {}).get(str(b)) for s in
                                       range(1, nseeds + 1)] for b in BUDGETS}
                        for lab, v in by_label.items()}
        timing[peer] = {lab: [merged_runs[peer][lab].get(str(s), {}).get("wall_s") for s in
                              range(1, nseeds + 1)] for lab in by_label}
        pairs_of[peer] = sorted((lab, int(s)) for lab, v in by_label.items() for s in v)
        opts[peer] = (None, merged_runs[peer])
    md = []
    groups = {}
    for peer, pairs in pairs_of.items():
        if not a.pairs_of or peer == a.pairs_of:
            groups.setdefault(tuple(pairs), []).append(peer)
    for pairs, peers in groups.items():
        # Every other peer that ran all of these (partition, seed) pairs joins the table.
        peers += [p for p in pairs_of if p not in peers and set(pairs) <= set(pairs_of[p])]
        peers.sort(key=list(NAMES).index)
        distinct = {p: [opts[p][1][lab][str(seed)]["distinct"] for lab, seed in pairs]
                    for p in peers}
        md.append(f"{', '.join(NAMES[p] for p in peers)}: {len({p for p, _ in pairs})} "
                  f"partitions, {len(pairs)} (partition, seed) runs; distinct points measured "
                  "at 224 (mean): " + ", ".join(
                      f"{NAMES[p]} {sum(v) / len(v):.1f}" for p, v in distinct.items()) + "\n")
        md.append(table(scores, ["mbo", "random"] + peers, list(pairs), classes, timing) + "\n")
        md.append("Cells where a peer's mean is above mbo's: " +
                  (", ".join(beats(scores, peers, list(pairs), classes)) or "none") + "\n")
    Path(a.table).write_text("\n".join(md))
    print("\n".join(md))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spaces", required=True)
    ap.add_argument("--out", required=True,
                    help="JSON written by a run; with --table, a comma-separated list to merge")
    ap.add_argument("--peers", default="", help="run these: nsga2,tpe,qnehvi")
    ap.add_argument("--cpp-json", help="search_efficiency --json output (for --table)")
    ap.add_argument("--table", help="write the markdown tables of the --out files here")
    ap.add_argument("--pairs-of", default="",
                    help="with --table: one table, on this peer's (partition, seed) runs")
    ap.add_argument("--seeds", type=int, default=5, help="the last seed run")
    ap.add_argument("--first-seed", type=int, default=1,
                    help="the first seed run (seeds split over processes; --table merges them)")
    ap.add_argument("--per-class", type=int, default=0,
                    help="partitions per class, the first by name (0: all)")
    ap.add_argument("--mc-samples", type=int, default=32, help="qLogNEHVI's QMC samples")
    ap.add_argument("--candidates", type=int, default=256,
                    help="qLogNEHVI: unmeasured configurations scored per batch (0: all)")
    ap.add_argument("--filter", default="")
    a = ap.parse_args()
    if not 1 <= a.first_seed <= a.seeds:
        ap.error(f"--first-seed {a.first_seed}: allowed 1..--seeds ({a.seeds})")
    dumps = load_dumps(a.spaces)
    if a.filter:
        dumps = {k: v for k, v in dumps.items() if any(f in k for f in a.filter.split(","))}
    classes = {k: v["class"] for k, v in dumps.items()}
    if a.peers:
        run(a, dumps, classes)
    if a.table:
        tables(a, dumps, classes)


if __name__ == "__main__":
    main()
