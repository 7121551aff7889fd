"""``python -m validation VERB ...``: the GPU lab's runners (:mod:`validation.verbs`)."""

import sys

from validation.verbs import main

if __name__ == "__main__":
    sys.exit(main())
