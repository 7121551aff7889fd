"""``python -m validation.calibrate`` is ``mksim calibrate``."""

import sys

from mksim.cli import main

if __name__ == "__main__":
    sys.exit(main(["calibrate", *sys.argv[1:]]))
