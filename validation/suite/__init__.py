"""The validation suite: standard cases run on a GPU and held against their predictions.

- :mod:`validation.suite.core` — the cases, running them (:func:`run_suite`), the summary
  (:func:`summarize`) and its markdown table; re-exported here;
- :mod:`validation.suite.parts` — the suite in parts that fit a device call, and their merge
  (``python -m validation suite`` on a machine without typer);
- :mod:`validation.suite.schedules` — the megakernel schedules the suite runs as ``searched``;
- :mod:`validation.suite.targets` — the megakernel design targets, from a summary's rows;
- :mod:`validation.suite.plots` — the summary's plots (data first, then matplotlib);
- :mod:`validation.suite.anatomy` — where a layer's time goes, from a persistent kernel's stamps.

>>> from validation import suite
>>> len(suite.CASES), suite.CASES[0].name
(48, 'llama-3.2-1b/b1/stream')
"""

from validation.suite.core import (
    BATCHES,
    CASES,
    DOCS_BEGIN,
    DOCS_END,
    FORMAT,
    FUSIONS,
    GPU,
    KERNEL_SOURCES,
    KV_LEN,
    MEASURED,
    MEGAKERNEL_SCHEDULES,
    MODELS,
    MODES,
    REL_ERR_MAX,
    RESULTS,
    SCHEDULES,
    SEARCHED,
    SUMMARY,
    TABLE,
    Case,
    Measure,
    Refused,
    build,
    check_kernel_fit,
    code_version,
    device_info,
    fused_workload_options,
    git_blob_id,
    kendall_tau_b,
    kernel_options,
    load_measured,
    markdown_table,
    metrics,
    one_line,
    ordered,
    predicted_us,
    real_measure,
    run_case,
    run_suite,
    schedule_for_gpu,
    search_fixed,
    searched_schedule_path,
    select,
    splice_docs,
    standard_cases,
    summarize,
    trace_file,
    workload_options,
    write_summary,
)

__all__ = ["BATCHES", "CASES", "DOCS_BEGIN", "DOCS_END", "FORMAT", "FUSIONS", "GPU", "KERNEL_SOURCES", "KV_LEN",
           "MEASURED", "MEGAKERNEL_SCHEDULES", "MODELS", "MODES", "REL_ERR_MAX", "RESULTS", "SCHEDULES", "SEARCHED",
           "SUMMARY", "TABLE", "Case", "Measure", "Refused", "build", "check_kernel_fit", "code_version",
           "device_info", "fused_workload_options", "git_blob_id", "kendall_tau_b", "kernel_options",
           "load_measured", "markdown_table", "metrics", "one_line", "ordered", "predicted_us", "real_measure",
           "run_case", "run_suite", "schedule_for_gpu", "search_fixed", "searched_schedule_path", "select",
           "splice_docs", "standard_cases", "summarize", "trace_file", "workload_options", "write_summary"]
