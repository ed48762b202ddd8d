"""Compare two runs' metrics.jsonl step by step, every key but timings, throughput and memory peaks.

Usage: python bench/compare_metrics.py A/metrics.jsonl B/metrics.jsonl. Prints the keys whose values differ
(first differing step, both values, how many steps) and the keys only one run writes; docs/design.md's
"refactor parity" paragraph used it.
"""

import json
import sys

SKIP = (
    "timing_s/",
    "timing_per_token_ms/",
    "perf/throughput",
    "perf/time_per_step",
    "perf/cpu_threads",
    "perf/max_",
    "perf/cpu_max_rss",
    "perf/plan_",
)


def rows(path):
    return [json.loads(line) for line in open(path)]


a, b = rows(sys.argv[1]), rows(sys.argv[2])
print(f"steps: {len(a)} vs {len(b)}")
keys_a = set().union(*map(set, a))
keys_b = set().union(*map(set, b))
skipped = sorted(k for k in keys_a | keys_b if k.startswith(SKIP))
print("skipped keys:", skipped)
print("only in first:", sorted(k for k in keys_a - keys_b if not k.startswith(SKIP)))
print("only in second:", sorted(k for k in keys_b - keys_a if not k.startswith(SKIP)))
differ = {}
compared = 0
for ra, rb in zip(a, b, strict=False):  # the step counts are printed above
    for k in sorted(set(ra) & set(rb)):
        if k.startswith(SKIP):
            continue
        compared += 1
        if ra[k] != rb[k]:
            differ.setdefault(k, []).append((ra["step"], ra[k], rb[k]))
print(f"values compared: {compared}; keys that differ: {len(differ)}")
for k, v in differ.items():
    print(f"  {k}: first differs at step {v[0][0]} ({v[0][1]!r} vs {v[0][2]!r}); {len(v)} steps differ")
