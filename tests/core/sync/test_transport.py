"""Bucketed file transport: order, bucket bounds, exact round trip, loud failures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from fp8rl_core.sync.transport import FORMAT, read_manifest, read_sync, write_sync


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randint(0, 256, (64, 32), dtype=torch.uint8, generator=g),  # 2048 B
        "a.weight_scale": torch.randint(0, 256, (64, 1), dtype=torch.uint8, generator=g),  # 64 B
        "b.weight": torch.randn(32, 32, generator=g).to(torch.bfloat16),  # 2048 B
        "norm.weight": torch.randn(32, generator=g),  # 128 B
        "big.weight": torch.randn(100, 64, generator=g),  # 25600 B > a bucket
    }


@pytest.mark.parametrize("bucket_bytes, expected", [(4096, [["a.weight", "a.weight_scale"], ["b.weight", "norm.weight"], ["big.weight"]]),
                                                    (2048, [["a.weight"], ["a.weight_scale"], ["b.weight"], ["norm.weight"], ["big.weight"]]),
                                                    (1 << 30, [["a.weight", "a.weight_scale", "b.weight", "norm.weight", "big.weight"]])])
def test_buckets_are_bounded_and_ordered(tmp_path, bucket_bytes, expected):
    ts = _tensors()
    h = write_sync(ts, 3, bucket_bytes=bucket_bytes, root=tmp_path)
    m = read_manifest(h.manifest)
    assert m["format"] == FORMAT and m["version"] == 3
    assert [b["names"] for b in m["buckets"]] == expected
    assert h.total_bytes == sum(t.numel() * t.element_size() for t in ts.values()) == 2048 + 64 + 2048 + 128 + 25600
    assert all(b["bytes"] <= bucket_bytes or len(b["names"]) == 1 for b in m["buckets"])
    back = list(read_sync(h.manifest))
    assert [n for n, _ in back] == list(ts)
    for name, t in back:
        assert t.dtype == ts[name].dtype and torch.equal(t, ts[name])
    h.remove()
    assert not h.manifest.parent.exists()


def test_a_missing_bucket_is_an_error_naming_it(tmp_path):
    h = write_sync(_tensors(), 1, bucket_bytes=4096, root=tmp_path)
    victim = h.manifest.parent / "bucket-0001.safetensors"
    victim.unlink()
    with pytest.raises(FileNotFoundError, match="bucket-0001.safetensors.*missing"):
        list(read_sync(h.manifest))


def test_not_a_manifest(tmp_path):
    p = tmp_path / "manifest.json"
    p.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="not an fp8rl sync manifest"):
        read_manifest(p)


@pytest.mark.parametrize("kwargs, match", [({"bucket_bytes": 0}, "bucket_bytes"), ({"version": -1}, "version")])
def test_bad_arguments(tmp_path, kwargs, match):
    args = {"bucket_bytes": 1024, "version": 0} | kwargs
    with pytest.raises(ValueError, match=match):
        write_sync(_tensors(), args["version"], bucket_bytes=args["bucket_bytes"], root=tmp_path)


def test_a_removed_sync_leaves_nothing_and_a_forgotten_one_is_removed_at_exit(tmp_path):
    h = write_sync(_tensors(), 2, bucket_bytes=4096, root=tmp_path)
    assert len(list(h.manifest.parent.iterdir())) == 1 + h.buckets
    h.remove()
    assert list(tmp_path.iterdir()) == []
    # a process that writes a sync and exits without removing it (an exception in between, say)
    code = ("import sys, torch\n"
            "from fp8rl_core.sync.transport import write_sync\n"
            "h = write_sync({'w': torch.ones(64, 64)}, 5, bucket_bytes=4096, root=sys.argv[1])\n"
            "print(h.manifest)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip().startswith(str(tmp_path / "fp8rl-sync-v5-"))
    assert list(tmp_path.iterdir()) == []
