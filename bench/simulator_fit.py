"""Fit memfit's simulator figures on the calibration readings (and only on them).

Every ``role: calibration`` run of ``tests/data/published_truth/simulators/`` is planned
without its simulator (the CUDA context, the learner, everything memfit models itself); what
the reading has beyond that is the simulator's. The figures follow in order, each from the
readings that isolate it:

1. per env of the cartpole: the slope of the state-only readings (the larger of the two
   cards'), and each card's base with rendering off: its smallest state-only reading less
   its environments;
2. each card's renderer base and bytes per pixel: the camera readings of one data type,
   least squares over ``render + pixel x (pixels of every render product) + shared x
   (pixels of the largest product)``, each product a square grid of tiles; a card with
   one camera per reading only takes the RTX 4090's split between the two;
3. what a further data type adds: the RGB+depth reading;
4. per env of the Franka arm: how its two readings differ from the cartpole's at the same
   settings (the same cameras, so only the scene differs);
5. the scene rule ``fixed + per_joint x joints``: through the cartpole (2 joints) and the
   Shadow Hand training run (24 joints);
6. the standard camera's factor: the camera lift reading;
7. the GUI viewport: the GUI reading;
8. Genesis: base and per env from its two calibration readings.

    python bench/simulator_fit.py       # prints the figures; memfit.core.simulator_figures
                                        # holds them (tests/core/test_simulator_truth.py
                                        # checks they agree)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the fit lives with the tests' shared support code
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

from simulator_fit_figures import fit


def main() -> int:
    figures = fit()
    for card, f in figures["cards"].items():
        print(card)
        for k, v in f.items():
            print(f"    {k} = {v:,.2f}")
    for key in ("robot_per_env", "scene_rule", "genesis"):
        print(key, {k: f"{v:,.0f}" for k, v in figures[key].items()})
    for key in ("extra_type_fraction", "standard_factor", "viewport_bytes"):
        print(key, f"{figures[key]:,.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
