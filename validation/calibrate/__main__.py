"""``python -m validation.calibrate`` is ``mksim calibrate``."""

import sys

from mksim.console import run_app
from validation.cli import calibrate_app

if __name__ == "__main__":
    run_app(calibrate_app, sys.argv[1:], "mksim calibrate")
