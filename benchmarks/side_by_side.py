"""Printing two rates measured side by side in one run: medians, every run, and their ratio against a goal."""

from __future__ import annotations

import statistics


def report(header: str, unit: str, reference: tuple[str, list[float]], ours: tuple[str, list[float]],
           goal: float) -> None:
    (ref_name, ref_rates), (our_name, our_rates) = reference, ours
    r, o = statistics.median(ref_rates), statistics.median(our_rates)
    width = max(len(ref_name), len(our_name), len("ratio ours / reference"))
    print(header)
    for name, rates, median in ((ref_name, ref_rates, r), (our_name, our_rates, o)):
        print(f"{name:<{width}} {median:7.1f} {unit}   runs: {', '.join(f'{x:.1f}' for x in rates)}")
    print(f"{'ratio ours / reference':<{width}} {o / r:7.2f}x   (goal >= {goal:.2f}x)")
