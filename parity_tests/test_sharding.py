"""The JAX trainer on a device mesh equals the single-device run.

JAX fixes its device count when it starts, so the check runs in a subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (8 simulated CPU devices) and
reports back as JSON. Tolerance: per-step metrics and final parameters within 1e-5
(float32; sharding only reorders sums, e.g. the all-reduce of gradients).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, jax, jax.numpy as jnp, numpy as np
    from grpospec import CountingConfig
    from jaxgrpo.counting import make_train
    from jaxgrpo.sharding import make_mesh, sharded_train, train_counting_sharded

    cfg = CountingConfig(steps=12, estimator="{estimator}", dynamic_sampling={ds})
    seeds = list(range(8))
    keys = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
    ref_state, ref = jax.jit(jax.vmap(make_train(cfg)))(keys)
    out = {{"devices": len(jax.devices())}}
    for s, d in [(8, 1), (2, 4), (1, 8)]:
        mesh = make_mesh(s, d)
        state, m = train_counting_sharded(cfg, seeds, mesh)
        hlo = sharded_train(cfg, mesh).lower(keys).compile().as_text()
        metric = max(float(np.nanmax(np.abs(m[k] - np.asarray(ref[k])))) for k in m)
        params = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                     zip(jax.tree.leaves(state), jax.tree.leaves(ref_state))
                     if jnp.issubdtype(a.dtype, jnp.floating))
        shards = len(jax.tree.leaves(state)[0].addressable_shards)
        out[f"{{s}}x{{d}}"] = dict(metric=metric, params=params, shards=shards,
                                   all_reduce="all-reduce" in hlo)
    print(json.dumps(out))
""")


@pytest.mark.parametrize("estimator, ds", [("grpo", False), ("gae", True)])
def test_sharded_runs_equal_the_single_device_run(estimator, ds):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(estimator=estimator, ds=ds)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 8
    for mesh in ("8x1", "2x4", "1x8"):
        r = out[mesh]
        assert r["metric"] < 1e-5 and r["params"] < 1e-5, (mesh, r)
        assert r["shards"] == 8  # the state really lives on all 8 devices
    # with a data axis, gradients of the replicated parameters are all-reduced
    assert out["2x4"]["all_reduce"] and out["1x8"]["all_reduce"]


def test_mesh_that_does_not_fit_gets_a_clear_error():
    from grpospec import CountingConfig
    from jaxgrpo.sharding import check_mesh_fits, make_mesh, parse_mesh

    with pytest.raises(ValueError, match="needs 8 devices"):
        make_mesh(2, 4, devices=["d"] * 4)
    with pytest.raises(ValueError, match="mesh must look like SEEDSxDATA"):
        parse_mesh("2by4")
    mesh = make_mesh(1, 1)
    check_mesh_fits(CountingConfig(), 3, mesh)  # one device takes anything
    fake = type("M", (), {"shape": {"seeds": 2, "data": 3}})()
    with pytest.raises(ValueError, match=r"number of seeds \(3\) must be a multiple"):
        check_mesh_fits(CountingConfig(), 3, fake)
    with pytest.raises(ValueError, match=r"n_prompts \(16\) must be a multiple"):
        check_mesh_fits(CountingConfig(), 4, fake)
