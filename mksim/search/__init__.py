"""Schedule search with Optuna (``pip install 'mksim[search]'``).

>>> from mksim.search import SEARCH_MODES, POLICY_CHOICES
>>> SEARCH_MODES
('megakernel', 'graph_pdl', 'graph')
"""

from ._space import DESIGNS, POLICY_CHOICES, ROLES, SEARCH_MODES, Candidate, Problem, baseline_params, build, suggest
from ._study import OBJECTIVES, SearchResult, save_best, search, summarize

__all__ = ["Candidate", "DESIGNS", "OBJECTIVES", "POLICY_CHOICES", "Problem", "ROLES", "SEARCH_MODES", "SearchResult",
           "baseline_params", "build", "save_best", "search", "suggest", "summarize"]
