"""``python -m batchlab simulate|tune``: see :mod:`batchlab.cli`."""
from .cli import main

raise SystemExit(main())
