"""Run simulator schedules from the command line.

    python -m tests.sim --seed 1234 --verbose        # one schedule, with its trace
    python -m tests.sim --seeds 500 --start 1000      # seeds 1000..1499, stop at the first failure
    python -m tests.sim --seeds 50 --profile fence-race --mutation no-recovery-read-fence

Exit status 1 when a schedule violates an invariant; the report names the seed and the command that
reproduces it.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import time

from .schedule import PROFILES, run
from .world import MUTATION_FLAGS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, help="run exactly this seed")
    ap.add_argument("--seeds", type=int, default=100, help="how many seeds to run (default 100)")
    ap.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--profile", default="default", choices=sorted(PROFILES))
    ap.add_argument(
        "--mutation",
        default="none",
        help=f"none, or safety rules to switch off, joined by '+': {', '.join(MUTATION_FLAGS)}",
    )
    ap.add_argument("--disable", default="", help="comma-separated invariant labels not to check (e.g. 7,3)")
    ap.add_argument("--verbose", "-v", action="store_true", help="print the trace of each schedule run")
    ap.add_argument("--strict", action="store_true", help="known core bugs (checker.KNOWN_BUGS) fail too")
    ap.add_argument("--keep-going", action="store_true", help="do not stop at the first failing seed")
    ap.add_argument("--digest", action="store_true", help="print a digest of each trace (determinism checks)")
    args = ap.parse_args(argv)
    unknown = [m for m in args.mutation.split("+") if m not in ("none", *MUTATION_FLAGS)]
    if unknown:
        ap.error(f"unknown mutation(s) {unknown}")

    # The bookie core logs the simulated faults it meets (storage read errors); the trace has them already.
    logging.getLogger("ledgerstore.bookie").setLevel(logging.CRITICAL)
    seeds = [args.seed] if args.seed is not None else list(range(args.start, args.start + args.seeds))
    disabled = frozenset(x for x in args.disable.split(",") if x)
    failures = 0
    known = 0
    steps = 0
    t0 = time.perf_counter()
    for seed in seeds:
        out = run(
            seed,
            args.profile,
            args.mutation,
            trace=args.verbose or args.digest,
            disabled=disabled,
            strict=args.strict,
        )
        steps += out.steps
        if out.known:
            known += 1
            if out.ok and not args.verbose and len(seeds) > 1:
                print(out.report(), flush=True)
        if args.verbose and out.trace is not None:
            print("\n".join(out.trace))
        if args.digest and out.trace is not None:
            print(f"seed={seed} digest={hashlib.sha256(chr(10).join(out.trace).encode()).hexdigest()}")
        if not out.ok:
            failures += 1
            print(out.report(), flush=True)
            if not args.keep_going:
                break
        elif args.verbose or len(seeds) == 1:
            print(out.report())
    dt = time.perf_counter() - t0
    n = len(seeds)
    print(
        f"{n} schedule(s), {failures} failing, {known} hitting known bugs, {steps} steps in {dt:.1f}s "
        f"({n / dt:.1f} schedules/s, {steps / dt:.0f} steps/s)",
        file=sys.stderr,
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
