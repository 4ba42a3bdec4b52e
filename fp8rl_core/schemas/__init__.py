"""Pandera schemas for every metrics table fp8rl writes, and :func:`validate`, which checks one.

A run's numbers travel as tables of rows (``list[dict]``, logged as parquet/CSV): a wrong column there
reaches a plot or a verdict silently. Each schema states what a table's rows must satisfy, and
each constraint names what it protects. :func:`validate` checks a table (a list of row dicts or a
DataFrame) against :data:`SCHEMAS` lazily — every problem at once — and raises :class:`TableError`
with one line per problem: the table, the column, the rule in words, the offending rows (index labels:
list positions for a list of dicts; the first few and a count) and their values, e.g.::

    table 'tokens': column 'sampler_logprob' must be ≤ 0 (a log-probability); rows 3, 7 (2 rows) hold 0.2, 1.5

Extra columns: every table is *strict* — a column the schema does not declare is refused (a renamed or
misspelt key would otherwise pass unchecked and the real column be reported missing only by a reader).
Columns that legitimately vary are declared as patterns: ``check/W1`` … ``check/W7`` (steps, clean
syncs) and the confidence bounds ``<metric>_lo`` / ``<metric>_hi`` (KL summary). Optional columns (only
some writers add them) are declared ``required=False``. Dtypes are strict, except lossless widenings
done before validation: integer → float in float columns, whole-number floats → int64 in count columns
(``metrics.mismatch`` returns counts as floats), integral numbers/None → nullable ``Int64``, booleans/None
→ nullable ``boolean`` (what a list of dicts or a parquet/CSV read-back yields); 1.5 in a count column,
text in a number column or 1 in a True/False column is refused, naming its rows.

The package, by job
-------------------
:mod:`.dsl` — the declaration language (column kinds, checks, rules across columns, :class:`Table`);
:mod:`.steps` (``steps``, ``tokens``, ``microbatches``), :mod:`.kl` (``kl_summary``, ``probe``) and
:mod:`.sync_checks` (``checks``, ``clean_syncs``, ``detection_matrix``) — the tables, each module's
docstring saying who writes them and what each rule protects; :mod:`.tables` — :data:`TABLES` and
:data:`SCHEMAS` by name; :mod:`.validation` — :func:`validate` and the error translation. The rows are
built by the code that produces them (e.g. :func:`fp8rl_core.checks.check_rows`,
:func:`fp8rl_core.learner.grpo.microbatch_rows`); the names they share across layers (conditions,
tiers, KL metrics, tolerances) come from :mod:`fp8rl_core.vocabulary`.
"""

from .tables import SCHEMAS, TABLES
from .validation import Problem, TableError, validate

__all__ = ["SCHEMAS", "TABLES", "Problem", "TableError", "validate"]
