"""Run each fuzzer for a bounded time and say how many inputs it tried: `python -m tests.fuzz.run [SECONDS]`.

Each target runs in its own process under libFuzzer's limits (-max_total_time, -rss_limit_mb, -malloc_limit_mb: an
input that makes the code allocate more than that is a failure, as a crash is), from a corpus seeded with valid
requests. A run fails on a non-zero exit, a traceback in its output, or no inputs tried.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("tests.fuzz.fuzz_provider", "tests.fuzz.fuzz_webhook")
MALLOC_LIMIT_MB = 64
RSS_LIMIT_MB = 1024


@dataclass(frozen=True)
class Outcome:
    target: str
    seconds: float
    inputs: int
    ok: bool
    why: str


def fuzz(target: str, seconds: int) -> Outcome:
    module = __import__(target, fromlist=["seeds"])
    with tempfile.TemporaryDirectory(prefix="fuzz-corpus-") as corpus:
        for i, seed in enumerate(module.seeds()):
            (Path(corpus) / f"seed-{i}").write_bytes(seed)
        args = [sys.executable, "-m", target, corpus, f"-max_total_time={seconds}", f"-rss_limit_mb={RSS_LIMIT_MB}",
                f"-malloc_limit_mb={MALLOC_LIMIT_MB}", "-print_final_stats=1", "-timeout=10",
                f"-artifact_prefix={corpus}/"]  # fmt: skip
        done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=seconds + 120, check=False)
    output = done.stdout + done.stderr
    found = re.search(r"stat::number_of_executed_units:\s*(\d+)", output)
    inputs = int(found.group(1)) if found else 0
    why = ""
    if done.returncode != 0:
        why = f"exit {done.returncode}:\n{output[-3000:]}"
    elif "Traceback" in output:
        why = f"a traceback in its output:\n{output[-3000:]}"
    elif inputs == 0:
        why = f"no inputs tried:\n{output[-3000:]}"
    return Outcome(target, seconds, inputs, not why, why)


def main(argv: list[str]) -> int:
    seconds = int(argv[1]) if len(argv) > 1 else 60
    failed = False
    for target in TARGETS:
        outcome = fuzz(target, seconds)
        verdict = "no crash, no allocation over the limit, no traceback" if outcome.ok else "FAILED"
        print(f"{target}: {outcome.inputs} inputs in {seconds} s: {verdict}", flush=True)
        if not outcome.ok:
            print(outcome.why, file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
