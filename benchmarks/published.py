"""`make bench`: the simulator against engines' published measurements (llmcap.published): every cell of
catalog/data/published/ replayed under its engine's preset, its error unscaled and with the (engine, GPU)
speed factor fitted on the fit cells, then the held-out median and worst per engine and per (engine, GPU)."""

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


if __name__ == "__main__":
    main()
