"""A run's dataset files checked and identified before anything runs: verl's RL dataset format, read with
pyarrow (no verl import).

A file is a parquet table with one row per prompt, the columns verl's own preprocessing scripts write
(``examples/data_preprocess/gsm8k.py``): the prompt column (``data.prompt_key``, default ``prompt``) as chat
messages (a list of ``{role, content}``), ``data_source`` (the scorer of the row), ``reward_model`` with a
``ground_truth`` field, and optionally ``extra_info``. :func:`check_file` refuses anything else with one
line naming the file, the column and what would be valid; :func:`file_sha256` is the file's content hash (part
of a run's id: a changed file is a new run); :func:`longest_prompt` counts the longest prompt's tokens with a
tokenizer's ``tokenizer.json`` — the messages' contents only, a lower bound of what verl feeds (its chat
template adds tokens; :func:`tokenizer_file` finds the file without a download); draws W7's probe batch from the validation file (:func:`probe_batch`, the same tokenization); :func:`parse_reward`
(:func:`reward_function`: the function itself) resolves a user's scoring function (``path/to/file.py:function`` or ``module:function``) and checks it takes
verl's arguments. Results are memoized by file, size and modification time. docs/configs.md, "The data".
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__all__ = ["REQUIRED", "REWARD_ARGS", "check_file", "file_sha256", "longest_prompt", "parse_reward", "probe_batch",
           "reward_function", "reward_target", "tokenizer_file"]

#: the columns every row needs besides the prompt column: verl's reward manager reads them
REQUIRED = ("data_source", "reward_model")
_FORMAT = "verl's RL dataset format: prompt (chat messages), data_source, reward_model.ground_truth, extra_info"


def _stamp(path: str) -> tuple[str, int, int]:
    p = Path(path).expanduser().resolve()
    st = p.stat()
    return str(p), st.st_size, st.st_mtime_ns


def check_file(path: str, prompt_key: str) -> str:
    """``path`` resolved, if it is a readable parquet file in verl's RL dataset format with its prompts under
    ``prompt_key``; else a ``ValueError`` of one line naming the file and the column."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"{path}: no such file; give a parquet file in {_FORMAT}")
    return _check(*_stamp(path), prompt_key=prompt_key)


@functools.lru_cache(maxsize=64)
def _check(path: str, size: int, mtime: int, prompt_key: str) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as e:
        raise ValueError(f"{path}: not a readable parquet file ({str(e).splitlines()[0]}); give one in {_FORMAT}") from None
    names = schema.names
    missing = [c for c in (prompt_key, *REQUIRED) if c not in names]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r} (columns: {', '.join(names)}); {_FORMAT}"
                         + (f", or set data.prompt_key to the prompt column" if missing[0] == prompt_key else ""))
    prompt = schema.field(prompt_key).type
    item = getattr(prompt, "value_type", None)
    if not (pa.types.is_list(prompt) or pa.types.is_large_list(prompt)) or not pa.types.is_struct(item) or \
            not {"role", "content"} <= {item.field(i).name for i in range(item.num_fields)}:
        raise ValueError(f"{path}: column {prompt_key!r} is {prompt}, not chat messages; each row's prompt must be a "
                         "list of {role, content} (e.g. [{role: user, content: '...'}])")
    reward = schema.field("reward_model").type
    if not pa.types.is_struct(reward) or "ground_truth" not in {reward.field(i).name for i in range(reward.num_fields)}:
        raise ValueError(f"{path}: column 'reward_model' is {reward}, without a 'ground_truth' field; each row's "
                         "reward_model must be {style: rule, ground_truth: <answer>}")
    if pq.ParquetFile(path).metadata.num_rows == 0:
        raise ValueError(f"{path}: no rows; give at least one prompt")
    return path


def file_sha256(path: str) -> str:
    """The SHA-256 of the file's bytes, hex."""
    return _sha256(*_stamp(path))


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tokenizer_file(model_path: str, cache_dir: str | None = None) -> Path | None:
    """The ``tokenizer.json`` of a checkpoint where it is on this machine: ``model_path``'s own file (a
    directory), else a hub id's file in the local Hugging Face cache (``cache_dir``: the cache's folder; None:
    Hugging Face's default) — nothing is downloaded; None where neither has it."""
    local = Path(model_path).expanduser() / "tokenizer.json"
    if local.is_file():
        return local
    if Path(model_path).expanduser().exists() or model_path.count("/") != 1:
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(model_path, "tokenizer.json", cache_dir=cache_dir)
    except ValueError:  # not a valid repo id
        return None
    return Path(found) if isinstance(found, str) else None


def longest_prompt(path: str, prompt_key: str, tokenizer_json: str) -> tuple[int, int]:
    """(tokens, row) of the longest prompt of the file: its messages' contents tokenized back to back by the
    tokenizer in ``tokenizer_json`` (no special tokens, no chat template: a lower bound)."""
    return _longest(*_stamp(path), prompt_key, *_stamp(tokenizer_json))


@functools.lru_cache(maxsize=64)
def _longest(path: str, size: int, mtime: int, prompt_key: str, tok: str, tok_size: int, tok_mtime: int) -> tuple[int, int]:
    lengths = [len(r) for r in _prompt_ids(path, prompt_key, tok)]
    row = max(range(len(lengths)), key=lengths.__getitem__)
    return lengths[row], row


def _prompt_ids(path: str, prompt_key: str, tok: str) -> list[list[int]]:
    """Every prompt of the file as token ids: its messages' contents back to back, tokenized by the tokenizer in
    ``tok`` without special tokens or chat template."""
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    rows = pq.read_table(path, columns=[prompt_key]).column(prompt_key).to_pylist()
    texts = ["".join(str(m.get("content") or "") for m in (msgs or [])) for msgs in rows]
    return [e.ids for e in Tokenizer.from_file(tok).encode_batch(texts, add_special_tokens=False)]


def probe_batch(path: str, prompt_key: str, tokenizer_json: str, n: int, max_len: int) -> tuple[tuple[int, ...], ...]:
    """W7's probe batch from a validation file: its first ``n`` prompts of at least 2 tokens, tokenized as
    :func:`longest_prompt` does, each cut to the shortest one's length and to ``max_len`` (one [n, T] batch of
    real prompts in the checkpoint's vocabulary)."""
    ids = [r for r in _prompt_ids(path, prompt_key, tokenizer_json) if len(r) >= 2][:n]
    if not ids:
        raise ValueError(f"{path}: no prompt of at least 2 tokens ({tokenizer_json}) for the W7 probe batch")
    t = min(min(len(r) for r in ids), max_len)
    return tuple(tuple(r[:t]) for r in ids)


#: the keyword arguments verl's reward manager calls a scoring function with
REWARD_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")


def reward_target(spec: str) -> tuple[str, str]:
    """verl's ``reward.custom_reward_function`` (``path``, ``name``) of ``spec``: ``path/to/file.py:function`` →
    (the file, resolved; the function), ``module:function`` → (``pkg://module``, the function). No import."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ValueError(f"{spec!r} is neither path/to/file.py:function nor module:function")
    if where.endswith(".py"):
        return str(Path(where).expanduser().resolve()), name
    return f"pkg://{where}", name


def parse_reward(spec: str) -> tuple[str, str]:
    """:func:`reward_target` of ``spec``, after checking that the function exists and takes verl's arguments
    (:data:`REWARD_ARGS`) as keywords — importing the file or module: a ``ValueError`` of one line otherwise."""
    reward_function(spec)
    return reward_target(spec)


def reward_function(spec: str):
    """The scoring function ``spec`` names (``path/to/file.py:function`` or ``module:function``), imported and
    checked to take verl's arguments (:data:`REWARD_ARGS`) as keywords: a ``ValueError`` of one line otherwise."""
    import importlib
    import importlib.util
    import inspect

    path, name = reward_target(spec)
    where = spec.rpartition(":")[0]
    if where.endswith(".py"):
        if not Path(where).expanduser().is_file():
            raise ValueError(f"{spec!r}: no such file {where}; give path/to/file.py:function or module:function")
        mod_spec = importlib.util.spec_from_file_location(f"fp8rl_reward_{hashlib.sha256(path.encode()).hexdigest()[:12]}", path)
        module = importlib.util.module_from_spec(mod_spec)
        try:
            mod_spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 — the user's file: any error is the message
            raise ValueError(f"{spec!r}: {where} does not import ({type(e).__name__}: {e})") from None
    else:
        try:
            module = importlib.import_module(where)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"{spec!r}: module {where!r} does not import ({type(e).__name__}: {e})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{spec!r}: {where} defines no function {name!r}")
    try:
        inspect.signature(fn).bind(**{a: None for a in REWARD_ARGS})
    except TypeError:
        raise ValueError(f"{spec!r}: {name}{inspect.signature(fn)} cannot take verl's arguments "
                         f"({', '.join(REWARD_ARGS)}) as keywords") from None
    return fn
