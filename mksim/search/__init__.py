"""Schedule search with Optuna (``pip install 'mksim[search]'``).

>>> from mksim.search import SEARCH_MODES, POLICY_CHOICES
>>> SEARCH_MODES
('megakernel', 'graph_pdl', 'graph')
"""

from ._report import report_rows, write_report
from ._space import (
    DESIGNS,
    POLICY_CHOICES,
    ROLES,
    SEARCH_MODES,
    Candidate,
    Problem,
    baseline_params,
    build,
    candidate_from_params,
    implied_designs,
    pages_costed,
    ring_fixed,
    suggest,
)
from ._study import OBJECTIVES, SearchResult, default_study_name, save_best, search, summarize

__all__ = ["Candidate", "DESIGNS", "OBJECTIVES", "POLICY_CHOICES", "Problem", "ROLES", "SEARCH_MODES", "SearchResult",
           "baseline_params", "build", "candidate_from_params", "default_study_name", "implied_designs", "pages_costed",
           "report_rows", "ring_fixed", "save_best", "search", "suggest", "summarize", "write_report"]
