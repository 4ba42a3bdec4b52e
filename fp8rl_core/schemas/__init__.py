"""Pandera schemas for every metrics table fp8rl writes, and :func:`validate`, which checks one.

Rule: every table is strict (undeclared columns refused), dtypes strict but for lossless widenings, and
each constraint names what it protects; :func:`validate` reports every problem at once, naming table,
column, rule and rows (:mod:`.validation`). By job: :mod:`.dsl` (the declaration language), :mod:`.steps`,
:mod:`.kl`, :mod:`.sync_checks` (the tables), :mod:`.tables` (:data:`SCHEMAS` by name). What each table
holds: docs/metrics.md (Params, tags, artifacts, tables).
"""

from .tables import SCHEMAS, TABLES
from .validation import Problem, TableError, validate

__all__ = ["SCHEMAS", "TABLES", "Problem", "TableError", "validate"]
