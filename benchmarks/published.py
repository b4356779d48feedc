"""`make bench`: the simulator against engines' published measurements (llmcap.published): every cell of
llmcap/published/ replayed under its engine's preset, its error unscaled and with the (engine, GPU)
speed factor fitted on the fit cells, then the held-out median and worst per engine and per (engine, GPU);
and the same summaries with each GPU's public calibration in every knob group (the H200 keeps some at the
defaults: the check's one gap)."""

from __future__ import annotations

import time

from llmcap.published import evaluate, load_cells, table_lines


def main() -> None:
    cells = load_cells()
    start = time.perf_counter()
    results = evaluate(cells)
    wall = time.perf_counter() - start
    print(
        f"\npublished engine measurements: {len(cells)} cells replayed in {wall:.1f} s (error: predicted / published - 1)"
    )
    for line in table_lines(results):
        print(line)
    # the diagnostic: each GPU on its public calibration in every knob group (differs where independent timings
    # kept some groups at the defaults: the H200)
    print("with each GPU's public calibration in every knob group (not what the sizing uses):")
    for line in table_lines(evaluate(cells, public=True)):
        if line.startswith("held out"):
            print(line)


if __name__ == "__main__":
    main()
