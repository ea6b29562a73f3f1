#!/usr/bin/env python3
"""The whole model against an independent implementation (issue 4).

    test_torch_twin.py path/to/twin_dump

For each tiny configuration below, twin_dump (tests/twin_dump.cpp) runs one FP32 forward and
backward of nibble's Transformer and writes the weights, the batch, the loss and every parameter
gradient. This script loads the same weights into the PyTorch twin (torch_llama.py), recomputes
loss and gradients with autograd in float64, and compares.

Tolerance. The twin in float64 is exact to ~1e-16, so the difference is nibble's FP32 rounding.
A length-K FP32 dot product of well-scaled operands errs by about sqrt(K) * u relative (u = 2^-24,
half of FP32's epsilon; errors of independent roundings add like a random walk; Higham's worst case
K * u is never approached with round-to-nearest on random data). A gradient accumulates such errors
from every operation between the loss and that weight, forward and backward: per block about a
dozen reductions (norm, 4 linears with their dgrad and wgrad, QK^T, PV, softmax and its backward),
of length at most K = max(width, hidden, seq, vocab, batch*seq tokens), each well conditioned
(norms and softmax are contractions; residual adds do not amplify). So the norm-wise relative error
of a gradient tensor is expected near u * sqrt(K) * sqrt(ops) and bounded by

    tol = C * u * sqrt(K) * ops,   ops = 12 * (layers + 1) (head, final norm and loss: one more block),

which charges the ops linearly instead of as a random walk (a factor sqrt(ops) ~ 6 of headroom) and
adds a factor C = 4 for the reductions' conditioning (softmax backward and the norm gains' token
sums subtract terms of similar size). For the configs below (K = 96) tol is 8e-5 to 1.1e-4; the
measured errors are 0.6e-6 to 2e-6 (printed by the test: ~40x margin, and close to the random-walk
estimate u * sqrt(K) * sqrt(ops) ~ 3.5e-6). Injected bugs give 6e-4 (RMSNorm with 2*eps, on the
sharp config; 5e-2 on the default-init one) to 1e1 (a sign in softmax backward), so the test fails
on them. Each of q, k, v (and gate, up) is compared on its own, so a bug in one part of a fused
weight is not hidden by a larger gradient in another.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:  # a missing dependency is a failure, not a skip: install-deps installs it
    print(f"FAIL: {sys.executable} cannot import {e.name} ({e}). Install python3-torch (Debian package; "
          "scripts/install-deps.sh does it, `make test` runs that) or configure with "
          "-DNIBBLE_PYTHON3=<an interpreter that has torch and numpy>.", file=sys.stderr)
    sys.exit(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_llama import NORM_EPS, ROPE_THETA, Llama, LlamaConfig  # noqa: E402

U_FP32 = 2.0 ** -24  # FP32 unit roundoff
C_CONDITIONING = 4.0
OPS_PER_BLOCK = 12

# (name, twin_dump arguments). Default weights (init_std 0.02) make RMSNorm's eps matter (the
# residual's mean square is ~4e-4, so eps 1e-5 moves the result by ~1%); init_std 0.3 makes
# attention sharp, so softmax and RoPE carry gradients far from their near-uniform regime.
CONFIGS = [
    ("gqa_tied", "layers=2 heads=4 kv_heads=2 width=32 context=16 vocab=65 batch=3 tied=1 seed=1"),
    ("gqa_untied_sharp", "layers=2 heads=4 kv_heads=2 width=32 context=16 vocab=65 batch=3 tied=0 init_std=0.3 seed=2"),
    ("mha_short_seq", "layers=2 heads=4 kv_heads=4 width=32 context=16 vocab=65 batch=3 seq=11 tied=0 init_std=0.1 seed=3"),
    ("mqa_3_layers", "layers=3 heads=4 kv_heads=1 width=32 context=16 vocab=65 batch=2 tied=1 init_std=0.2 seed=4"),
]

DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32}


def read_safetensors(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A plain reader (8-byte header length, JSON header, data), independent of nibble's."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        tensors[name] = np.frombuffer(data[begin:end], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return tensors, meta


def twin_for(meta: dict[str, str]) -> Llama:
    c = LlamaConfig(vocab=int(meta["vocab"]), layers=int(meta["layers"]), heads=int(meta["heads"]),
                    kv_heads=int(meta["kv_heads"]), width=int(meta["width"]), mlp_hidden=int(meta["mlp_hidden"]),
                    context=int(meta["context"]), tied_embeddings=meta["tied_embeddings"] == "1")
    # The twin keeps its own conventions; a changed default in nibble is reported here by name.
    for key, ours in (("norm_eps", NORM_EPS), ("rope_theta", ROPE_THETA)):
        if not math.isclose(float(meta[key]), ours, rel_tol=1e-6):
            raise AssertionError(f"nibble uses {key}={meta[key]}, the twin {ours}: update torch_llama.py if intended")
    return Llama(c).double()


def pieces(name: str, g: np.ndarray, c: LlamaConfig) -> list[tuple[str, slice]]:
    """Row ranges compared separately: q/k/v of a fused QKV, gate/up of a fused gate_up."""
    if name.endswith(".qkv"):
        q, kv = c.heads * c.head_dim, c.kv_head_count * c.head_dim
        return [(name + "[q]", slice(0, q)), (name + "[k]", slice(q, q + kv)), (name + "[v]", slice(q + kv, q + 2 * kv))]
    if name.endswith(".gate_up"):
        return [(name + "[gate]", slice(0, c.hidden)), (name + "[up]", slice(c.hidden, 2 * c.hidden))]
    return [(name, slice(0, g.shape[0]))]


def check_config(label: str, dump_exe: str, args: str, workdir: str) -> list[str]:
    path = os.path.join(workdir, label + ".safetensors")
    subprocess.run([dump_exe, path, *args.split()], check=True, stdout=subprocess.DEVNULL)
    tensors, meta = read_safetensors(path)
    model = twin_for(meta)
    c = model.c
    params = model.nibble_parameters()
    dumped = sorted(k[len("param."):] for k in tensors if k.startswith("param."))
    if dumped != sorted(params):
        return [f"{label}: nibble's parameters {dumped} are not the twin's {sorted(params)}"]
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(torch.from_numpy(tensors["param." + name].astype(np.float64)).reshape(p.shape))
    tokens = torch.from_numpy(tensors["tokens"].astype(np.int64))
    targets = torch.from_numpy(tensors["targets"].astype(np.int64))
    loss = model(tokens, targets)
    loss.backward()

    K = max(c.width, c.hidden, tokens.shape[1], c.vocab, tokens.numel())
    tol = C_CONDITIONING * U_FP32 * math.sqrt(K) * OPS_PER_BLOCK * (c.layers + 1)
    failures = []
    loss_err = abs(float(tensors["loss"][0]) - loss.item()) / abs(loss.item())
    worst = ("loss", loss_err)
    if not loss_err <= tol:
        failures.append(f"{label}: loss nibble {float(tensors['loss'][0]):.9f} twin {loss.item():.9f} "
                        f"(relative error {loss_err:.2e} > {tol:.2e})")
    for name, p in params.items():
        ref = p.grad.detach().reshape(tensors["grad." + name].shape).numpy()
        got = tensors["grad." + name].astype(np.float64)
        for piece, rows in pieces(name, ref, c):
            ref_norm = np.linalg.norm(ref[rows])
            err = np.linalg.norm(got[rows] - ref[rows]) / ref_norm if ref_norm > 0 else math.inf
            if err > worst[1]:
                worst = (piece, err)
            if not err <= tol:
                failures.append(f"{label}: grad {piece}: relative error {err:.2e} > {tol:.2e} "
                                f"(|twin| {ref_norm:.3e}, |nibble - twin| {np.linalg.norm(got[rows] - ref[rows]):.3e})")
    print(f"{label:18s} loss {loss.item():.6f}  worst relative error {worst[1]:.2e} ({worst[0]})  "
          f"tolerance {tol:.2e}  {'ok' if not failures else 'FAIL'}")
    return failures


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: test_torch_twin.py path/to/twin_dump", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__} (float64 autograd) vs nibble FP32, u = 2^-24")
    failures = []
    with tempfile.TemporaryDirectory(prefix="nibble-twin-") as workdir:
        for label, args in CONFIGS:
            failures += check_config(label, sys.argv[1], args, workdir)
    for f in failures:
        print("FAIL " + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
