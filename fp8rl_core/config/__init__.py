"""The experiment config: :mod:`.schema` (the frozen pydantic models of a sweep file and its runs),
:mod:`.loading` (a sweep file and its ``key=value`` overrides read and validated), :mod:`.runs` (a sweep
expanded into its runs, their ids, names and tags: the :class:`~fp8rl_core.config.runs.Sweep`).
Specified in docs/configs.md."""
