"""``python -m batchlab.calibrate [--raw | DIR]``: refit and rewrite data/calibration.csv and calibration_errors.csv."""
from .shipped import main

raise SystemExit(main())
