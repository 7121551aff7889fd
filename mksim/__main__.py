"""``python -m mksim`` and the ``mksim`` command. A Ctrl-C while the command line is still loading
ends as one during a run does: one line and exit status 130, no traceback."""

import sys


def run() -> None:
    try:
        from mksim.cli import main
    except KeyboardInterrupt:
        print("error: interrupted while mksim was starting", file=sys.stderr)
        sys.exit(130)
    main()


if __name__ == "__main__":
    run()
