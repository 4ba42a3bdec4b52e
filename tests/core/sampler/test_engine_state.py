"""The engine's other state on a real model (the dense test mini, Hugging Face's Qwen3): every buffer and tensor
attribute that is not a parameter nor declared as changing at a sync is recorded and compared; a change of one
element by one float32 step is named with its tensor and position, a declared tensor's change is not."""

from __future__ import annotations

import torch
from transformers import Qwen3ForCausalLM

from fp8rl_core.sampler.engine_state import (ATTRIBUTES_CHANGING_AT_SYNC, CHANGES_AT_SYNC, changes_at_sync, compare,
                                             counterpart_values, engine_attributes, engine_tensors, record)
from tests.core.sampler.conftest import SPECS


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(SPECS["dense"].hf_config()).eval()


def test_every_buffer_and_tensor_attribute_but_parameters_and_declared_ones_is_the_state():
    model = _model()
    model.model.layers[0].self_attn.fp8rl_w = torch.ones(3)  # a compute copy: declared as changing at a sync
    model.model.layers[0].self_attn.kv_cache = torch.zeros(2)  # written by every forward: declared
    model.model.layers[1].mlp.scratch = torch.arange(4.0)  # any other tensor attribute: state
    names = dict(engine_tensors(model))
    # the rotary embedding's buffer (shared by every layer, named once) and its copy at load; no parameter
    assert set(names) == {"model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq", "model.layers.1.mlp.scratch"}
    assert not {id(p) for p in model.parameters()} & {id(t) for t in names.values()}
    assert changes_at_sync("fp8rl_w_w13") == CHANGES_AT_SYNC["fp8rl_w_*"] and changes_at_sync("inv_freq") is None


def test_a_one_step_change_of_one_element_is_named_with_tensor_rank_and_position():
    model = _model()
    start = record(model)
    clean = compare(model, start, 1, 2)
    assert (clean["rank"], clean["tp"], clean["checked"], clean["offenders"]) == (1, 2, 2, [])
    assert clean["changing"] == CHANGES_AT_SYNC | ATTRIBUTES_CHANGING_AT_SYNC and clean["seconds"] >= 0
    model.model.layers[0].self_attn.fp8rl_w = torch.ones(3)  # a declared tensor appears: no offender
    inv = model.model.rotary_emb.inv_freq
    before = inv[3].item()
    inv[3] = torch.nextafter(inv[3], torch.tensor(float("inf")))
    (o,) = compare(model, start, 1, 2)["offenders"]
    assert o == (f"tp rank 1/2: model.rotary_emb.inv_freq: changed since the engine started, first at [3] "
                 f"({before:.9g} → {inv[3].item():.9g}; 1 of 16 elements differ)"), o
    inv[3] = before
    assert compare(model, start, 1, 2)["offenders"] == []
    # a tensor replaced by one of another dtype, one gone, one new
    model.model.rotary_emb.inv_freq = inv.double()
    del model.model.rotary_emb.original_inv_freq
    model.model.norm.extra = torch.zeros(2, dtype=torch.int64)
    assert compare(model, start, 0, 1)["offenders"] == [
        "tp rank 0/1: model.norm.extra: not held at the engine start, now [[2], 'int64']",
        "tp rank 0/1: model.rotary_emb.inv_freq: shape/dtype [[16], 'float32'] at the engine start, now [[16], 'float64']",
        "tp rank 0/1: model.rotary_emb.original_inv_freq: held at the engine start, gone now"]


def test_every_plain_module_attribute_is_state_compared_by_value_and_the_engines_table_picks_the_learners():
    """A module's plain attributes (numbers, booleans, strings, None, short tuples) are recorded at the engine
    start and compared by value: a norm's eps changed after the start is named with module, attribute and both
    values, one gone and one new too; the declared ones (a layer's post-load count) are not; tensors, modules and
    long lists are not plain attributes. An engine's table of counterparts picks out the attributes to set beside
    the learner's config, with their values."""
    model = _model()
    attrs = engine_attributes(model)
    norm = "model.layers.1.input_layernorm.variance_epsilon"
    scaling = model.model.layers[0].self_attn.scaling
    assert attrs[norm] == repr(1e-6) and attrs["model.layers.0.self_attn.scaling"] == repr(scaling)
    assert abs(scaling - 32 ** -0.5) < 1e-15
    assert attrs["model.layers.0.self_attn.training"] == "False" and not [k for k in attrs if k.split(".")[-1].startswith("_")]
    assert "model.rotary_emb.inv_freq" not in attrs and "model.layers" not in attrs  # a tensor, a module list
    start = record(model)
    assert start["attributes"] == attrs
    model.model.layers[0].mlp.fp8rl_processed = 2  # declared as changing at a sync: not state
    model.model.layers[0].mlp.long = list(range(40))  # a table, not a setting
    assert compare(model, start, 1, 2)["offenders"] == [] and compare(model, start, 1, 2)["attributes"] == len(attrs)
    model.model.layers[1].input_layernorm.variance_epsilon = 1e-5
    del model.model.layers[0].self_attn.scaling
    model.model.norm.soft_cap = 30.0
    assert compare(model, start, 1, 2)["offenders"] == [
        f"tp rank 1/2: model.layers.0.self_attn.scaling: attribute {scaling!r} at the engine start, gone now",
        f"tp rank 1/2: {norm}: attribute 1e-06 at the engine start, now 1e-05",
        "tp rank 1/2: model.norm.soft_cap: attribute not there at the engine start, now 30.0"]
    table = {(r"Qwen3RMSNorm", "variance_epsilon"): "rms_norm_eps", ("Qwen3Attention", "head_dim"): "head_dim"}
    values = counterpart_values(model, table)
    assert values["head_dim"] == [[f"model.layers.{i}.self_attn.head_dim", 32] for i in range(2)]
    assert [norm, 1e-5] in values["rms_norm_eps"] and len(values["rms_norm_eps"]) == 2 * 4 + 1  # 4 norms a layer + final
    assert compare(model, start, 0, 1, table)["config"] == values
