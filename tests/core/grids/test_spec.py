import pytest

from fp8rl_core.grids import E4M3, E5M2, Grid, GridSpecError, parse_grid

VALID = [
    "bf16",
    *(f"mxfp8-{e}-{r}" for e in ("e4m3", "e5m2") for r in ("rceil", "floor", "ceil", "even")),
    "mxfp8-e4m3-rceil-nan-propagate",
    "mxfp8-e5m2-floor-nan-propagate",
    "fp8-block128-e4m3",
    "fp8-block128-e4m3-ue8m0",
    "fp8-tensor-e4m3",
    "fp8-tensor-e5m2-pow2",
    "fp8-kv-e4m3-vllm",
    "fp8-kv-e5m2-sglang",
]


@pytest.mark.parametrize("spec", VALID)
def test_round_trip(spec):
    g = parse_grid(spec)
    assert str(g) == spec
    assert parse_grid(str(g)) == g
    assert hash(g) == hash(parse_grid(spec))
    assert parse_grid(g) is g


def test_defaults_and_fields():
    g = parse_grid("MXFP8-E4M3-RCEIL-nan-ignore")
    assert str(g) == "mxfp8-e4m3-rceil"  # default policy omitted from the canonical form
    assert (g.family, g.elem, g.rule, g.nan) == ("mxfp8", "e4m3", "rceil", "ignore")
    assert g.format is E4M3
    assert parse_grid("fp8-tensor-e5m2").format is E5M2
    assert parse_grid("fp8-kv-e4m3-sglang").writer == "sglang"
    assert not parse_grid("bf16").is_fp8
    with pytest.raises(ValueError, match="no FP8 element format"):
        parse_grid("bf16").format
    with pytest.raises(Exception):
        g.rule = "floor"  # frozen


@pytest.mark.parametrize(
    "spec, words",
    [
        ("fp16", "unknown grid family"),
        ("mxfp8-e4m3", "mxfp8-<element>-<scale rule>"),
        ("mxfp8-e3m4-rceil", "element format 'e3m4' is not one of e4m3, e5m2"),
        ("mxfp8-e4m3-round", "MX scale rule 'round' is not one of rceil, floor, ceil, even"),
        ("mxfp8-e4m3-rceil-nan-drop", "NaN policy 'drop'"),
        ("mxfp8-e4m3-rceil-inf-ignore", "expected '-nan-<policy>'"),
        ("fp8-block128-e5m2", "E4M3 only"),
        ("fp8-block128-e4m3-pow2", "only '-ue8m0'"),
        ("fp8-tensor-e4m3-ue8m0", "only '-pow2'"),
        ("fp8-kv-e4m3", "fp8-kv-<element>-<vllm|sglang>"),
        ("fp8-kv-e4m3-trtllm", "KV-cache writer 'trtllm'"),
        ("fp8-channel-e4m3", "unknown fp8 grid kind 'channel'"),
        (7, "expected a string, got int"),
    ],
)
def test_errors_name_the_problem_and_list_valid_forms(spec, words):
    with pytest.raises(GridSpecError) as err:
        parse_grid(spec)
    msg = str(err.value)
    assert words in msg
    assert "Valid forms:" in msg and "mxfp8-{e4m3|e5m2}-{rceil|floor|ceil|even}" in msg


def test_grid_is_a_value():
    assert {parse_grid("mxfp8-e4m3-rceil"), parse_grid("mxfp8-e4m3-rceil")} == {Grid("mxfp8", "e4m3", "rceil")}
