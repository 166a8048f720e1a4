"""Constrained greedy on the default model vs llama-server's constrained greedy on the same weights: the agreement
figures (issue 29, point 6). The cases and the comparison are ``tests/support/grammar_agreement.py``'s, which
``tests/test_remote_grammar_llama.py`` asserts on.

For each case: unconstrained greedy on both sides (where the two engines agree on the prompt at all), then the
constrained pair token by token: identical or not, tokens agreed before parting, and whether the parting is put down
to the engines' numbers (a near-tie of the local model, or the server ranking the pair the other way). JSON schemas
are reported as figures only (llama-server's schema converter and llguidance's differ on whitespace and extra keys).

Measured here (2 cores; the server with -t 2): GBNF 5 of 8 identical, 41 of 63 tokens agreed before parting, 3
partings all explained (0.01-0.09 nats, the server ranking the pair the other way), valid 8/8 both sides; JSON
schemas 0 of 3 identical, 26 of 98 tokens, partings at extra keys and whitespace the two converters read apart,
valid 3/3 both sides. Unconstrained greedy on the same prompts: 95-114 of 123 tokens agreed before parting.

    .venv/bin/python benchmarks/bench_grammar_server.py [--base-url URL]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import support_path  # noqa: F401  (tests/support on sys.path)
from bench_remote import start_server
from support.grammar_agreement import GBNF_CASES, SCHEMA_CASES, Parting, compare, summary


def describe(parting: Parting | None) -> str:
    if parting is None:
        return "same tokens, other text"
    server = {True: "flips", False: "keeps", None: "lacks"}[parting.flipped]
    return (f"part after {parting.at} tokens ({parting.gap_nats:+.2f} nats locally; the server {server} the pair; "
            f"{'explained' if parting.explained else 'UNEXPLAINED'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="", help="a running llama-server on the default model's GGUF "
                        "(default: start ours)")
    args = parser.parse_args()
    from playground.config import ModelSettings
    from playground.models.default_model import fetch_default_model
    from playground.models.loading import load_model

    fetch_default_model()
    lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    server = None
    url = args.base_url
    if not url:
        server, url = start_server()
    try:
        for title, cases in (("GBNF grammars", GBNF_CASES), ("JSON schemas", SCHEMA_CASES)):
            print(f"\n{title}")
            outcomes = []
            for case in cases:
                o = compare(lm, url, case)
                outcomes.append(o)
                part = "identical" if o.identical else describe(o.parting)
                valid = f"valid local {'yes' if not o.local_problem else 'NO'}, server " \
                        f"{'yes' if not o.server_problem else 'NO'}"
                print(f"  {case.name:24} {part}; {valid}; unconstrained agree {o.unconstrained_agree}/"
                      f"{o.unconstrained_total}\n      local  {o.local_text!r}\n      server {o.server_text!r}")
            f = summary(outcomes)
            print(f"  {f['identical']} of {f['cases']} identical; {f['tokens_agreed']} of {f['tokens_compared']} "
                  f"tokens agreed before parting; partings explained {f['partings_explained']}, unexplained "
                  f"{f['partings_unexplained']}; valid: local {f['local_valid']}/{f['cases']}, server "
                  f"{f['server_valid']}/{f['cases']}; unconstrained greedy agreed {f['unconstrained_agreed']} of "
                  f"{f['unconstrained_compared']}; chosen-token probability gap max {f['max_prob_gap']:.3f}")
    finally:
        if server is not None:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
