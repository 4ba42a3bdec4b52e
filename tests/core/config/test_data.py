"""The data section: a dataset in verl's RL format checked when the config is read — each error one line
naming the config file, the field, the data file and the column —, its content hash in the run's id, and the
default (fp8rl's addition task) leaving every run id as it was."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from fp8rl_core.config.loading import ConfigError
from fp8rl_core.config.runs import Sweep, run_id
from fp8rl_core.config.schema import RunConfig
from fp8rl_core.config.sections import DataSection
from tests import gsm8k_data
from tests.core.config.files import MODELS


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A checkpoint directory of the dense mini (untrained) with the tokenizer trained on the test's problems."""
    from fp8rl_core.learner.models import build_model
    from fp8rl_core.learner.spec import load_model_spec

    d = tmp_path_factory.mktemp("model")
    build_model(load_model_spec(MODELS / "qwen3-dense-mini.yaml"), 0).save_pretrained(d)
    return gsm8k_data.train_tokenizer(gsm8k_data.corpus(gsm8k_data.problems(64)), d, vocab_size=400)


@pytest.fixture()
def data(tmp_path) -> tuple[Path, Path]:
    return gsm8k_data.write_dataset(tmp_path / "gsm8k", 40, 8)


def sweep_file(tmp_path: Path, model_dir: Path, train: Path, val: Path, extra: str = "") -> Path:
    path = tmp_path / "byod.yaml"
    path.write_text(f"""sweep: byod
base:
  models_dir: {MODELS}
  model: qwen3-dense-mini
  backend: verl
  model_path: {model_dir}
  verl: {{hardware: cpu}}
  sampler: {{max_model_len: 384}}
  data: {{train: {train}, val: {val}, max_response_length: 128}}
{extra}""")
    return path


def error(path: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        Sweep.load(path, list(overrides))
    msg = str(e.value)
    assert "\n" not in msg, msg  # one line
    return msg


def test_a_gsm8k_dataset_loads_and_its_content_hash_is_in_the_run_id(tmp_path, model_dir, data):
    path = sweep_file(tmp_path, model_dir, *data)
    run = Sweep.load(path).runs[0]
    d = run.config.data
    assert d.train == str(data[0]) and d.max_prompt_length is None and d.prompt_length(384, 0) == 384 - 128
    assert set(d.sha256) == {"train", "val"} and all(len(h) == 64 for h in d.sha256.values())
    dump = run.config.model_dump(mode="json")  # the run's MLflow params: path and content hash
    assert dump["data"]["train"] == str(data[0]) and dump["data"]["sha256"] == d.sha256
    # the default: the addition task, left out of the id; a dataset is part of it
    default = run.config.model_copy(update={"data": DataSection(), "verl": run.config.verl})
    assert run.id != run_id(default, run.spec)
    # a changed file is a new run id (resume never mixes two datasets)
    gsm8k_data.write_dataset(data[0].parent, 40, 8, seed=1)
    again = Sweep.load(path).runs[0]
    assert again.config.data.sha256["train"] != d.sha256["train"] and again.id != run.id


def test_the_default_data_is_the_addition_task_and_stays_out_of_run_ids():
    cfg = RunConfig(models_dir=str(MODELS))
    assert cfg.data == DataSection() and cfg.data.is_task and cfg.data.sha256 is None
    assert cfg.data.response_length(5) == 6 and cfg.data.prompt_length(64, 5) == 58
    # written out at its defaults, the section changes no id (tests/core/test_identity.py pins the shipped ones)
    spelled = RunConfig(models_dir=str(MODELS), data={"prompt_key": "prompt", "train": None, "reward": None})
    assert run_id(spelled) == run_id(cfg)


def test_a_missing_file_is_one_line_naming_the_field_and_the_file(tmp_path, model_dir, data):
    path = sweep_file(tmp_path, model_dir, tmp_path / "nope.parquet", data[1])
    assert error(path) == (f"{path}: base.data.train: {tmp_path / 'nope.parquet'}: no such file; give a parquet file "
                           "in verl's RL dataset format: prompt (chat messages), data_source, reward_model.ground_truth, "
                           "extra_info")


def test_a_file_that_is_not_parquet_is_refused(tmp_path, model_dir, data):
    bad = tmp_path / "train.parquet"
    bad.write_text("question,answer\n1,2\n")
    msg = error(sweep_file(tmp_path, model_dir, bad, data[1]))
    assert f"base.data.train: {bad}: not a readable parquet file" in msg


def test_a_missing_column_is_one_line_naming_the_file_and_the_column(tmp_path, model_dir, data):
    rows = gsm8k_data.rows(gsm8k_data.problems(4), "train")
    no_reward = tmp_path / "no_reward.parquet"
    pd.DataFrame([{k: v for k, v in r.items() if k != "reward_model"} for r in rows]).to_parquet(no_reward)
    path = sweep_file(tmp_path, model_dir, data[0], no_reward)
    assert error(path) == (f"{path}: base.data.val: {no_reward}: no column 'reward_model' (columns: data_source, "
                           "prompt, ability, extra_info); verl's RL dataset format: prompt (chat messages), data_source, "
                           "reward_model.ground_truth, extra_info")
    # the prompt column under another name: data.prompt_key says which
    with pytest.raises(ConfigError) as e:  # one line per file
        Sweep.load(path, ["data.prompt_key=question", f"data.val={data[1]}"])
    lines = str(e.value).splitlines()
    assert [line.split(": ")[1] for line in lines] == ["base.data.train", "base.data.val"]
    assert all("no column 'question'" in line and line.endswith("or set data.prompt_key to the prompt column")
               for line in lines)
    as_text = tmp_path / "text_prompt.parquet"
    pd.DataFrame([r | {"prompt": r["prompt"][0]["content"]} for r in rows]).to_parquet(as_text)
    assert "column 'prompt' is large_string, not chat messages" in error(sweep_file(tmp_path, model_dir, as_text, data[1]))
    no_truth = tmp_path / "no_truth.parquet"
    pd.DataFrame([r | {"reward_model": {"style": "rule"}} for r in rows]).to_parquet(no_truth)
    assert "without a 'ground_truth' field" in error(sweep_file(tmp_path, model_dir, no_truth, data[1]))


def test_a_prompt_longer_than_the_prompt_length_is_one_line_with_its_row_and_tokens(tmp_path, model_dir, data):
    path = sweep_file(tmp_path, model_dir, *data)
    msg = error(path, "data.max_prompt_length=8")
    assert msg.startswith(f"{path}: base: data.train: {data[0]}: column 'prompt', row ")
    assert f"tokens ({model_dir / 'tokenizer.json'}, without the chat template), more than data.max_prompt_length = 8" in msg
    # the lengths together must fit the model length
    assert error(path, "sampler.max_model_len=100").endswith(
        "data.max_prompt_length + data.max_response_length = 100 tokens does not fit sampler.max_model_len = 100; "
        "raise sampler.max_model_len or lower them")
    assert "= 528 tokens does not fit sampler.max_model_len = 384" in error(path, "data.max_prompt_length=400")


def test_a_dataset_needs_a_checkpoint_and_a_native_checkpoint_needs_a_dataset(tmp_path, model_dir, data):
    path = sweep_file(tmp_path, model_dir, *data)
    assert error(path, "model_path=null") == (
        f"{path}: base: data.train needs model_path (a checkpoint directory or hub id with its tokenizer): the run's "
        "own warm start has the addition task's 16-token vocabulary")
    # natively: a dataset from a local checkpoint directory loads (tests/flows/test_pipelines.py runs one); a
    # folder without config.json (here: the tokenizer only; on either backend), a hub id natively, a checkpoint
    # without a dataset, or a scorer for the addition task is refused
    native = ["backend=native", "verl=null"]
    assert Sweep.load(path, native).runs[0].config.backend == "native"
    tok_only = gsm8k_data.train_tokenizer(gsm8k_data.corpus(gsm8k_data.problems(8)), tmp_path / "tokenizer", 300)
    for backend in ([], native):
        assert error(path, *backend, f"model_path={tok_only}") == (
            f"{path}: base: {tok_only / 'config.json'}: missing — model_path must be a Hugging Face checkpoint "
            "directory (config.json, *.safetensors, its tokenizer)")
    assert error(path, *native, "model_path=acme/tiny") == (
        f"{path}: base: model_path 'acme/tiny': no checkpoint directory (config.json) here; the native loop trains "
        "a local directory (a hub id: download it first, e.g. `hf download acme/tiny --local-dir <dir>`, and give "
        "the directory)")
    msg = error(path, "backend=native", "verl=null", "data.train=null", "data.val=null", "data.max_response_length=null")
    assert msg == (f"{path}: base: model_path with backend: native needs data.train and data.val: the native loop trains "
                   "a checkpoint on a dataset scored by its data_source (the addition task runs on the run's own warm "
                   "start: leave model_path unset)")
    assert "data.reward with the addition task and backend: native" in error(
        path, "backend=native", "verl=null", "model_path=null", "data.train=null", "data.val=null",
        "data.max_response_length=null", "data.reward=fp8rl_core.verl.reward:compute_score")


def test_a_dataset_needs_both_files_and_a_response_length(tmp_path, model_dir, data):
    path = sweep_file(tmp_path, model_dir, *data)
    assert "data.val is missing" in error(path, "data.val=null")
    assert "data.max_response_length is required with data.train" in error(path, "data.max_response_length=null")
    assert "data.sha256 is computed from the files" in error(path, "data.sha256={train: x}")


def test_a_user_reward_function_is_resolved_and_checked(tmp_path, model_dir, data):
    path = sweep_file(tmp_path, model_dir, *data)
    good = tmp_path / "my_reward.py"
    good.write_text("def score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n    return 1.0\n"
                    "def two_args(a, b):\n    return 0.0\n")
    run = Sweep.load(path, [f"data.reward={good}:score"]).runs[0]
    assert run.config.data.reward == f"{good}:score"
    assert Sweep.load(path, ["data.reward=fp8rl_core.verl.reward:compute_score"]).runs[0].id != run.id
    assert "defines no function 'nope'" in error(path, f"data.reward={good}:nope")
    assert "cannot take verl's arguments (data_source, solution_str, ground_truth, extra_info)" in error(
        path, f"data.reward={good}:two_args")
    assert f"no such file {tmp_path}/gone.py" in error(path, f"data.reward={tmp_path}/gone.py:score")
    assert "module 'no_such_module' does not import" in error(path, "data.reward=no_such_module:score")
    assert "neither path/to/file.py:function nor module:function" in error(path, "data.reward=score")
    # the addition task with backend: native takes fp8rl's own reward only
    plain = tmp_path / "native.yaml"
    plain.write_text(f"sweep: n\nbase: {{models_dir: {MODELS}, model: qwen3-dense-mini}}\n")
    assert "data.reward with the addition task and backend: native" in error(plain, f"data.reward={good}:score")


def test_verl_overrides_must_be_hydra_overrides(tmp_path, model_dir, data):
    path = sweep_file(tmp_path, model_dir, *data)
    run = Sweep.load(path, ["verl.overrides=[actor_rollout_ref.actor.ppo_epochs=2]"]).runs[0]
    assert run.config.verl.overrides == ["actor_rollout_ref.actor.ppo_epochs=2"]
    assert run.id != Sweep.load(path).runs[0].id  # set: part of the run id
    assert "verl.overrides: 'ppo_epochs' is not a Hydra override key=value" in error(path, "verl.overrides=[ppo_epochs]")


def test_the_tokenizer_is_found_in_the_checkpoint_or_the_local_hub_cache_never_downloaded(tmp_path, model_dir):
    from fp8rl_core.config.dataset import tokenizer_file

    assert tokenizer_file(str(model_dir)) == model_dir / "tokenizer.json"
    cache = tmp_path / "hub"
    snap = cache / "models--acme--tiny-gsm8k" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    (cache / "models--acme--tiny-gsm8k" / "refs").mkdir()
    (cache / "models--acme--tiny-gsm8k" / "refs" / "main").write_text("0123abcd")
    assert tokenizer_file("acme/tiny-gsm8k", str(cache)) == snap / "tokenizer.json"
    assert tokenizer_file("acme/not-cached", str(cache)) is None
    assert tokenizer_file(str(tmp_path), str(cache)) is None  # a directory without one


def test_the_w7_probe_of_a_dataset_run_is_its_validation_prompts_in_the_checkpoints_vocabulary(tmp_path, model_dir,
                                                                                                data):
    from tokenizers import Tokenizer

    run = Sweep.load(sweep_file(tmp_path, model_dir, *data), ["checks.probe_sequences=4"]).runs[0].config
    probe = run.check_probe()
    assert run.probe_source() == "data.val" and probe.shape[0] == 4
    # the first four validation prompts, tokenized by the checkpoint's own tokenizer, cut to the shortest one
    texts = ["".join(m["content"] for m in msgs) for msgs in pd.read_parquet(data[1])["prompt"][:4]]
    ids = [e.ids for e in Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode_batch(texts, add_special_tokens=False)]
    t = min(len(r) for r in ids)
    assert probe.shape[1] == t > 8 and probe.tolist() == [r[:t] for r in ids]
    assert int(probe.max()) < Tokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab_size()
    # no tokenizer on this machine (a hub id not cached): the task's sequences, and the run says so
    hub = run.model_copy(update={"model_path": "acme/not-cached"})
    assert hub.probe_source() == "task" and hub.check_probe().tolist() == run.check_prompts().sequences.tolist()
    # the addition task's runs keep their probe
    task = RunConfig(model="qwen3-dense-mini", models_dir=str(MODELS))
    assert task.probe_source() == "task" and task.check_probe().tolist() == task.check_prompts().sequences.tolist()


def test_the_gpu_configs_read_gsm8k_where_verls_preprocessing_saves_it_and_refuse_it_missing(tmp_path, monkeypatch,
                                                                                             gsm8k_home):
    root = Path(__file__).resolve().parents[3]
    run = Sweep.load(root / "configs" / "gpu" / "qwen3-8b.yaml", ["axes.seed=[0]"]).runs[0].config
    d = run.data
    assert (d.train, d.val, d.max_prompt_length, d.max_response_length, d.reward) == (
        "~/data/gsm8k/train.parquet", "~/data/gsm8k/test.parquet", 512, 1024, None)  # verl's gsm8k scorer by data_source
    assert set(pd.read_parquet(gsm8k_home / "data" / "gsm8k" / "train.parquet")["data_source"]) == {"openai/gsm8k"}
    monkeypatch.setenv("HOME", str(tmp_path))  # no data there
    with pytest.raises(ConfigError) as e:
        Sweep.load(root / "configs" / "gpu" / "qwen3-30b-a3b.yaml")
    lines = str(e.value).splitlines()  # one line per missing file, then the run it was found in
    assert [ln.split(": ")[1:3] for ln in lines[:2]] == [["base.data.train", "~/data/gsm8k/train.parquet"],
                                                         ["base.data.val", "~/data/gsm8k/test.parquet"]], lines
    assert all("no such file" in ln for ln in lines[:2]) and lines[2].strip().startswith("(in the run "), lines
