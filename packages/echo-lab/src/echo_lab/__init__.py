"""echo-lab: the measurement side of ECHO, apart from what a serving deployment runs.

- :mod:`echo_lab.bench`: lockstep benchmarks of every policy on the real engine, intervals, plots,
  the open-loop serving load, the projection to GPU batch sizes.
- :mod:`echo_lab.replay` and :mod:`echo_lab.sim`: deterministic replay of recorded candidate pools
  under measured and roofline cost models, trace recording, the synthetic comparison.
- :mod:`echo_lab.training`: self-distilled data, the draft head's training, gate calibration.
- :mod:`echo_lab.cli`: ``echo-sd demo | bench | bench-serve | sim | train-draft | calibrate``,
  registered into ``echo-sd`` through the ``echo_sd.commands`` entry-point group.
"""

__version__ = "0.1.0"
