"""Every metrics table by name: the declarations (:mod:`.steps`, :mod:`.kl`, :mod:`.sync_checks`) and the
pandera schema built from each."""

from __future__ import annotations

import pandera.pandas as pa

from .dsl import Table
from .kl import KL_SUMMARY, PROBE
from .matching import MATCHING, MATCHING_CHECKS, MATCHING_ENGINES
from .steps import MICROBATCHES, STEPS, TOKENS
from .sync_checks import CHECKS, CLEAN_SYNCS, DETECTION_MATRIX

__all__ = ["SCHEMAS", "TABLES"]

#: every metrics table's declaration, by table name
TABLES: dict[str, Table] = {t.name: t for t in (STEPS, TOKENS, MICROBATCHES, KL_SUMMARY, PROBE, CHECKS, CLEAN_SYNCS,
                                                 DETECTION_MATRIX, MATCHING, MATCHING_CHECKS,
                                                 MATCHING_ENGINES)}
#: the schema of every metrics table, by table name
SCHEMAS: dict[str, pa.DataFrameSchema] = {name: t.schema() for name, t in TABLES.items()}
