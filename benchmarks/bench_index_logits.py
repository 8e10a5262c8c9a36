"""index_logits benchmarks: the scoring kernels against the copy roofline, the torch twin (eager and with
its scoring function under torch.compile) and TileLang's FP8 example (``examples/deepseek_v32/
fp8_lighting_indexer.py``, timing only: FP8 keys, ragged, no paging; ``.peers/deepseek_v32/`` holds a copy
where it was fetched, otherwise the peer is skipped with a message).

Cases: decode ``b64n1k65536``, ``b64n4k65536``, ``b1n1k8192`` (every request at its klen, H = 64, cache
blocks of 64 rows in shuffled order) and ``prefill4096k65536`` (the last 4096 queries of a 65,536-key
context, query i seeing keys [0, 61441 + i)). The example runs the same work: decode as 64 (256, 1) ragged
queries over their own 65,536 (8,192) keys, prefill as the same causal ranges; its logits are not cleaned.
The torch twins are timed on the decode cases only (a prefill call of theirs takes minutes).

Bytes = index-cache rows read once per request + queries (68 B per head) + logits written (4 B per valid
column). Key rows are random codes with scale bytes 124-126 (within the kernels' fast path, as the store's
Hadamard-rotated rows are). ``run(h, no_torch_peers=True)`` (``--no-torch-peers``) skips the slow torch
peers; ``sweep=True`` (``--sweep``) times other ``IndexLogitsConfig`` choices of the same kernels as peers
(their names say how they differ).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import replace

import torch

from benchmarks.harness import compile_peer, time_peer, time_us
from reference.index_logits import key_scores_torch, paged_index_logits_torch_unchecked
from tilelang_ops.index_logits import launch_config, paged_index_logits, ragged_index_logits

OP = "index_logits"
HEADS, RPB, ROW = 64, 64, 68
DECODE = {"b64n1k65536": (64, 1, 65536), "b64n4k65536": (64, 4, 65536), "b1n1k8192": (1, 1, 8192)}
PREFILL = {"prefill4096k65536": (4096, 65536)}
PEER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".peers", "deepseek_v32")
FLUSH = 256 << 20


def _rows(n, g, device):
    """(codes [n, 64], scales [n, 4]) random index rows, scale bytes 124-126."""
    codes = torch.randint(0, 256, (n, 64), generator=g, dtype=torch.uint8).to(device)
    scales = torch.randint(124, 127, (n, 4), generator=g, dtype=torch.uint8).to(device)
    return codes, scales


def decode_inputs(b, n, klen, device="cuda", seed=0):
    g = torch.Generator().manual_seed(seed)
    nblk = -(-klen // RPB)
    num_blocks = b * nblk
    cache = torch.empty(num_blocks, RPB * ROW, dtype=torch.uint8, device=device)
    codes, scales = _rows(num_blocks * RPB, g, device)
    cache[:, :RPB * 64] = codes.reshape(num_blocks, -1)
    cache[:, RPB * 64:] = scales.reshape(num_blocks, -1)
    table = torch.randperm(num_blocks, generator=g).to(torch.int32).reshape(b, nblk).to(device)
    qc, qs = _rows(b * n * HEADS, g, device)
    return dict(q_codes=qc.reshape(b, n, HEADS, 64), q_scales=qs.reshape(b, n, HEADS, 4),
                weights=torch.randn(b, n, HEADS, generator=g).to(device) * 0.1, index_cache=cache,
                block_tables=table, klen=torch.full((b, n), klen, dtype=torch.int32, device=device),
                max_klen=klen)


def prefill_inputs(t, nkeys, device="cuda", seed=0):
    g = torch.Generator().manual_seed(seed)
    kc, ksc = _rows(nkeys, g, device)
    qc, qs = _rows(t * HEADS, g, device)
    ke = torch.arange(nkeys - t + 1, nkeys + 1, dtype=torch.int32, device=device)
    return dict(q_codes=qc.reshape(t, HEADS, 64), q_scales=qs.reshape(t, HEADS, 4),
                weights=torch.randn(t, HEADS, generator=g).to(device) * 0.1, k_codes=kc, k_scales=ksc,
                ks=torch.zeros(t, dtype=torch.int32, device=device), ke=ke, max_width=nkeys)


def _load_peer():
    path = os.path.join(PEER_DIR, "fp8_lighting_indexer.py")
    if not os.path.exists(path):
        print(f"peer tilelang_fp8_example skipped: {path} is absent (fetch tile-ai/tilelang's "
              "examples/deepseek_v32/fp8_lighting_indexer.py and utils.py there)")
        return None
    try:
        sys.path.insert(0, PEER_DIR)
        spec = importlib.util.spec_from_file_location("fp8_lighting_indexer", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    except Exception as exc:  # noqa: BLE001 - a peer that does not import is reported, not fatal
        print(f"peer tilelang_fp8_example skipped: {type(exc).__name__}: {str(exc)[:200]}")
        return None


def _example_fn(mod, nq, kv_rows, ks, ke, g):
    """The example's interface on FP8 queries [nq, 64, 128], keys [kv_rows, 128] and ranges ks / ke."""
    q = torch.randn(nq, HEADS, 128, generator=g).to("cuda").to(torch.float8_e4m3fn)
    kv = torch.randn(kv_rows, 128, generator=g).to("cuda").to(torch.float8_e4m3fn)
    scales = torch.rand(kv_rows, generator=g).to("cuda") + 0.5
    w = torch.randn(nq, HEADS, generator=g).to("cuda")
    return lambda: mod.mqa_attn_return_logits_interface(q, kv, scales, w, ks, ke, clean_logits=False)


def _config_peers(fn, base, flush):
    """Other configurations of the same kernels (peers named by what differs)."""
    alts = {"min_ctas0": replace(base, min_ctas=0), "stages3": replace(base, stages=3),
            "stages6": replace(base, stages=6), "kps_x2": replace(base, keys_per_cta=base.keys_per_cta * 2),
            "kps_x4": replace(base, keys_per_cta=base.keys_per_cta * 4)}
    if base.warps == 4 and base.rows <= 4:
        alts["w8_kc128"] = replace(base, warps=8, keys_per_step=128, min_ctas=0)
    out = {}
    for name, cfg in alts.items():
        us = time_peer(name, lambda cfg=cfg: fn(cfg), lambda f: time_us(f, flush_bytes=flush, rep=10))
        if us:
            out[name] = us
    return out


def _wgmma_peers(fn, launch, flush, rep):
    """The launch rule's wgmma configuration (``launch_config(..., wgmma=True)``: one row at 4 CTAs per SM,
    more at 3) and the same at one CTA per SM fewer; ``launch``: the launch rule's keywords."""
    out = {}
    if launch.get("n", 1) > 4:
        return out
    wg = launch_config(**launch, wgmma=True)
    for cfg in (wg, replace(wg, min_ctas=wg.min_ctas - 1)):
        name = f"wgmma_ctas{cfg.min_ctas}"
        us = time_peer(name, lambda cfg=cfg: fn(cfg), lambda f: time_us(f, flush_bytes=flush, rep=rep))
        if us:
            out[name] = us
    return out


def run(h, sweep: bool = False, no_torch_peers: bool = False) -> None:
    torch_peers = not no_torch_peers
    peer = _load_peer()
    g = torch.Generator().manual_seed(1)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    scorer = compile_peer(key_scores_torch) if torch_peers else None
    for case, (b, n, klen) in DECODE.items():
        kw = decode_inputs(b, n, klen)
        out = torch.empty(b, n, klen, dtype=torch.float32, device="cuda")
        launch = dict(op="paged", rows=b, width=klen, n=n, sms=sms)
        base = launch_config(**launch)
        fn = lambda cfg=base, kw=kw, out=out: paged_index_logits(**kw, out=out, config=cfg)  # noqa: E731
        us = time_us(fn, flush_bytes=FLUSH)
        nbytes = b * klen * ROW + b * n * HEADS * ROW + b * n * klen * 4
        peers = _config_peers(fn, base, FLUSH) if sweep else {}
        peers.update(_wgmma_peers(fn, launch, FLUSH, rep=10))
        if peer is not None:
            ks = (torch.arange(b * n, device="cuda", dtype=torch.int32) // n) * klen
            ex = _example_fn(peer, b * n, b * klen, ks, ks + klen, g)
            peers["tilelang_fp8_example"] = time_peer("tilelang_fp8_example", ex,
                                                      lambda f: time_us(f, rep=10))
        eager = compiled = None
        if torch_peers:
            slow = lambda f: time_us(f, warmup=1, rep=3)  # noqa: E731
            # the twin's arithmetic alone (the case's metadata is valid by construction)
            eager = time_peer("torch_eager", lambda kw=kw: paged_index_logits_torch_unchecked(**kw), slow)
            compiled = time_peer("torch_compile", scorer and (
                lambda kw=kw: paged_index_logits_torch_unchecked(**kw, scorer=scorer)), slow)
        h.report(OP, case, nbytes, us, eager_us=eager, compile_us=compiled,
                 peers={k: v for k, v in peers.items() if v})
        del kw, out
        torch.cuda.empty_cache()
    for case, (t, nkeys) in PREFILL.items():
        kw = prefill_inputs(t, nkeys)
        out = torch.empty(t, nkeys, dtype=torch.float32, device="cuda")
        launch = dict(op="ragged", rows=t, width=nkeys, sms=sms)
        base = launch_config(**launch)
        fn = lambda cfg=base, kw=kw, out=out: ragged_index_logits(**kw, out=out, config=cfg)  # noqa: E731
        us = time_us(fn, rep=10)
        widths = int((kw["ke"] - kw["ks"]).sum())
        nbytes = nkeys * ROW + t * HEADS * ROW + widths * 4
        peers = {}
        peers.update(_wgmma_peers(fn, launch, 0, rep=5))
        if sweep:
            peers.update(_config_peers(fn, base, 0))
            for rows, warps in ((8, 8), (2, 4), (1, 4)):
                cfg = replace(base, rows=rows, warps=warps, min_ctas=0 if warps == 8 else 3)
                peers[f"rows{rows}"] = time_peer(f"rows{rows}", lambda cfg=cfg, fn=fn: fn(cfg),
                                                 lambda f: time_us(f, rep=5))
        if peer is not None:
            ex = _example_fn(peer, t, nkeys, kw["ks"], kw["ke"], g)
            peers["tilelang_fp8_example"] = time_peer("tilelang_fp8_example", ex, lambda f: time_us(f, rep=5))
        # the torch twins are not timed here: one prefill call of theirs takes minutes
        h.report(OP, case, nbytes, us, peers={k: v for k, v in peers.items() if v})
