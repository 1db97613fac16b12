#!/usr/bin/env python3
"""The peers' truth scorer (bench/peer_scoring.py) agrees with search_efficiency's.

Runs search_efficiency on one partition with one seed, dumping its space (--dump-spaces), and
recomputes from the dump (1) random search's truth score at every budget, from its dumped order
and noisy measurements, and (2) the exhaustive search's (the measured front of every point);
both must equal the C++ JSON's to 1e-9. Also checks that the dump's noisy values are the noise
model's: within 6 s.d. of the truth, and not equal to it. Standard library only.

Usage: peer_scoring_test.py SEARCH_EFFICIENCY_BINARY WORKDIR
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from peer_scoring import TruthScorer, check, load_dumps  # noqa: E402

PARTITION = "qwen3-1.7b_tp8_mbs8_seq4096:fwd_mlp"


def main():
    binary, work = sys.argv[1], Path(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spaces, cpp_json = work / "spaces", work / "cpp.json"
    subprocess.run([binary, "--seeds", "1", "--filter", PARTITION, "--dump-spaces", str(spaces),
                    "--json", str(cpp_json)], check=True, stdout=subprocess.DEVNULL)
    compared, worst = check(spaces, cpp_json, tol=1e-9)
    budgets = json.loads(cpp_json.read_text())["partitions"][0]["random"].keys()
    assert compared == len(budgets) == 5, (compared, list(budgets))  # 28/56/112/168/224, 1 seed

    dumps = load_dumps(spaces)
    assert list(dumps) == [PARTITION], list(dumps)
    dump = dumps[PARTITION]
    scorer = TruthScorer(dump)
    measured = dump["seeds"]["1"]["measured"]
    got = scorer.score_measured_front(list(range(len(measured))), measured)
    want = json.loads(cpp_json.read_text())["partitions"][0]["exhaustive_truth"][0]
    assert abs(got - want) <= 1e-9, (got, want)
    # The exhaustive front of noisy draws misses some of the true hypervolume, never exceeds it.
    assert 0.9 < got < 1.0, got

    for (t, e), (tm, em) in zip(dump["true"], measured):
        assert abs(tm / t - 1) < 6 * dump["time_noise"] and abs(em / e - 1) < 6 * dump["noise"]
    assert sum(m != list(q) for q, m in zip(dump["true"], measured)) == len(measured)
    print(f"scorers agree on {compared} random-search scores (max |diff| {worst:.2g}) and the "
          f"exhaustive score ({got:.6f})")


if __name__ == "__main__":
    main()
