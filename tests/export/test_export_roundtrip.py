"""`nibble export` read back by independent readers.

  test_export_roundtrip.py SOURCE_DIR BUILD_DIR NIBBLE_BINARY

Trains a tiny NVFP4 run (3 blocks, GQA; the recipe keeps block 2 in BF16), exports it as
modelopt-nvfp4 and compressed-tensors-nvfp4, and checks with the safetensors, compressed-tensors
and transformers packages -- not with nibble's reader:

  round trip  the dequantized 4-bit weights of every NVFP4 linear equal nibble's own quantization
              of the FP32 checkpoint (`nibble quantize` + `nibble dequantize` on the fused q|k|v and
              gate|up weights, the way training quantizes them): bit for bit for ModelOpt (codes x
              (scale x weight_scale_2), nibble's order of FP32 operations), codes and E4M3 scales bit
              for bit for compressed-tensors, whose dequantize divides by the global scale instead of
              multiplying by its reciprocal (at most 1 ulp apart, counted); the excluded tensors equal
              the checkpoint's (exactly for --dtype fp32, round-to-nearest BF16 for bf16); the scale
              formulas hold (weight_scale_2 = 1/(2688/amax) of the fused group, weight_global_scale =
              2688/amax, shared by q/k/v and by gate/up; input scales one per input).
  end to end  transformers loads the compressed-tensors export (AutoModelForCausalLM, compressed-
              tensors decompressing to dense on CPU) and computes the validation loss on the first
              windows; compared with `nibble eval --weights-only-quantized` (FP32 GEMMs on the same
              dequantized weights) within a derived tolerance, and reported next to the W4A4 recipe's
              eval and the FP32 checkpoint's.
  the docs    docs/export.md's loading snippets (the code blocks after an `export_roundtrip runs this
              block: NAME` marker) are read from the page and run as written, on this test's exports,
              with only their `path = ...` line replaced: the documented arguments are the tested ones.
Prints a summary table; exits non-zero on any failed check.
"""

import json
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file as load_numpy

SRC, BUILD, NIBBLE = sys.argv[1], sys.argv[2], sys.argv[3]
WORK = os.path.join(BUILD, "export_roundtrip_tmp")
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def nibble(*args):
    r = subprocess.run([NIBBLE, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"nibble {' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout


def load_pt(path):
    """Every tensor of a safetensors file through safetensors' own PyTorch reader (F8_E4M3 included)."""
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def unpack_codes(packed):
    """Our own reading of ModelOpt's U8 [N, K/2]: element 2i in the low nibble."""
    p = packed.numpy()
    codes = np.empty((p.shape[0], p.shape[1] * 2), np.uint8)
    codes[:, 0::2] = p & 0x0F
    codes[:, 1::2] = p >> 4
    return codes


def ulps(a, b):
    ia = a.view(np.int32).astype(np.int64)
    ib = b.view(np.int32).astype(np.int64)
    return np.abs(ia - ib)


DOC = os.path.join(SRC, "docs", "export.md")


def doc_snippet(name, path):
    """The Python block docs/export.md marks `<!-- export_roundtrip runs this block: NAME -->`, with its
    one `path = "..."` line pointed at `path`. Exits (a failed test) when the page no longer has it."""
    import re
    text = open(DOC).read()
    marker = f"<!-- export_roundtrip runs this block: {name} -->"
    found = re.search(re.escape(marker) + r"\s*```python\n(.*?)\n```", text, re.S)
    if not found:
        sys.exit(f"{DOC}: no ```python block after `{marker}`: the page and this test have drifted apart")
    code = found.group(1)
    lines = re.findall(r'^path = "[^"]*".*$', code, re.M)
    if len(lines) != 1:
        sys.exit(f"{DOC}, block {name}: expected one `path = \"...\"` line to point at the export, found {len(lines)}")
    return code.replace(lines[0], f"path = {path!r}")


def run_doc_snippet(name, path):
    """Runs the documented block as a user would (its printed text captured) and returns its names."""
    import contextlib
    import io
    namespace = {"__name__": f"docs_export_{name.replace('-', '_')}"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(doc_snippet(name, path), f"{DOC}:{name}", "exec"), namespace)
    namespace["printed"] = printed.getvalue()
    return namespace


# ---------------------------------------------------------------- a tiny NVFP4 run
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
with open(os.path.join(SRC, "data", "tinyshakespeare.txt")) as f:
    corpus = f.read()[:80000]
with open(os.path.join(WORK, "corpus.txt"), "w") as f:
    f.write(corpus)
data = os.path.join(WORK, "data")
run_dir = os.path.join(WORK, "run")
nibble("prepare", os.path.join(WORK, "corpus.txt"), "-o", data)
with open(os.path.join(WORK, "tiny.yaml"), "w") as f:
    f.write(f"data:\n  dir: {data}\nsteps: 48\nbatch: 2\nquantization: nvfp4\n"
            "model:\n  layers: 3\n  heads: 4\n  kv_heads: 2\n  width: 64\n  context: 32\n"
            "schedule:\n  lr: 0.01\n  warmup_steps: 4\n"
            "eval:\n  interval: 24\n  batches: 2\ncheckpoint:\n  interval: 24\n  keep: 2\nlog:\n  interval: 4\nthreads: 2\n")
nibble("train", os.path.join(WORK, "tiny.yaml"), f"run.dir={run_dir}")
ckpt = os.path.join(run_dir, "checkpoints", "step_00000048")
fp32 = load_numpy(os.path.join(ckpt, "model.safetensors"))
config = json.load(open(os.path.join(ckpt, "config.json")))
L = config["num_hidden_layers"]

exports = {}
for name, fmt, extra in [("mo", "modelopt-nvfp4", ["--calibrate", "2"]),
                         ("mo_bf16", "modelopt-nvfp4", ["--calibrate", "2", "--dtype", "bf16"]),
                         ("ct", "compressed-tensors-nvfp4", ["--calibrate", "2"]),
                         ("hf", "hf", [])]:
    exports[name] = os.path.join(WORK, name)
    dtype = [] if "--dtype" in extra else ["--dtype", "fp32"]
    print(nibble("export", run_dir, "--format", fmt, "-o", exports[name], *extra, *dtype), end="")

hq = json.load(open(os.path.join(exports["mo"], "hf_quant_config.json")))
excluded = set(hq["quantization"]["exclude_modules"])
nvfp4_layers = [l for l in range(L) if f"model.layers.{l}.self_attn.q_proj" not in excluded]
check(nvfp4_layers == [0, 1] and "model.layers.2.mlp.down_proj" in excluded and "lm_head" in excluded,
      f"NVFP4 blocks {nvfp4_layers}, block 2 and lm_head excluded")

# ---------------------------------------------------------------- nibble's own quantization
GROUPS = {"self_attn": ["q_proj", "k_proj", "v_proj"], "o": ["o_proj"], "mlp": ["gate_proj", "up_proj"],
          "down": ["down_proj"]}
PREFIX = {"self_attn": "self_attn", "o": "self_attn", "mlp": "mlp", "down": "mlp"}
reference = {}  # module -> nibble's dequantized weight (FP32)
group_of = {}   # module -> (group key) for shared-scale checks
for l in nvfp4_layers:
    for g, parts in GROUPS.items():
        mods = [f"model.layers.{l}.{PREFIX[g]}.{p}" for p in parts]
        fused = np.concatenate([fp32[m + ".weight"] for m in mods], axis=0)
        npy = os.path.join(WORK, f"fused_{l}_{g}.npy")
        np.save(npy, np.ascontiguousarray(fused, dtype=np.float32))
        nibble("quantize", npy, "--format", "nvfp4", "--block", "16x16", "-o", npy + ".q.safetensors")
        nibble("dequantize", npy + ".q.safetensors", "-o", npy + ".deq.npy")
        deq = np.load(npy + ".deq.npy")
        row = 0
        for m in mods:
            n = fp32[m + ".weight"].shape[0]
            reference[m] = deq[row:row + n]
            group_of[m] = (l, g, float(np.abs(fused).max()))
            row += n

# ---------------------------------------------------------------- ModelOpt
mo = load_pt(os.path.join(exports["mo"], "model.safetensors"))
mo_bits = mo_total = 0
for m, ref in reference.items():
    w, s, s2 = mo[m + ".weight"], mo[m + ".weight_scale"], mo[m + ".weight_scale_2"]
    ok_layout = (w.dtype == torch.uint8 and list(w.shape) == [ref.shape[0], ref.shape[1] // 2]
                 and s.dtype == torch.float8_e4m3fn and list(s.shape) == [ref.shape[0], ref.shape[1] // 16]
                 and s2.dtype == torch.float32 and s2.dim() == 0)
    if not ok_layout:
        check(False, f"{m}: ModelOpt dtypes/shapes {w.dtype}{list(w.shape)} {s.dtype}{list(s.shape)} {s2.dtype}{list(s2.shape)}")
        continue
    scale = np.repeat(s.to(torch.float32).numpy(), 16, axis=1)
    s2v = np.float32(s2.item())
    deq = E2M1[unpack_codes(w)] * (scale * s2v)  # nibble's order: code * (scale * S_dec)
    mo_bits += int(np.sum(deq.view(np.int32) == ref.view(np.int32)))
    mo_total += ref.size
    amax = np.float32(group_of[m][2])
    check(s2v == np.float32(1) / (np.float32(2688) / amax) and abs(s2v / (amax / 2688) - 1) < 1e-6,
          f"{m}: weight_scale_2 {s2v:.6e} = 1/(2688/amax), amax {amax:.6f} of the fused group")
check(mo_bits == mo_total, f"ModelOpt: {mo_bits}/{mo_total} dequantized weights bit for bit nibble's")
for l in nvfp4_layers:
    for g, parts in GROUPS.items():
        mods = [f"model.layers.{l}.{PREFIX[g]}.{p}" for p in parts]
        s2s = {mo[m + ".weight_scale_2"].item() for m in mods}
        ins = {mo[m + ".input_scale"].item() for m in mods}
        check(len(s2s) == 1 and len(ins) == 1 and min(ins) > 0,
              f"layer {l} {'/'.join(parts)}: one weight_scale_2, one input_scale {min(ins):.4e}")

# ---------------------------------------------------------------- compressed-tensors
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.quantization import QuantizationConfig
from compressed_tensors.quantization.lifecycle.forward import dequantize

ct_config = json.load(open(os.path.join(exports["ct"], "config.json")))
qc = QuantizationConfig.model_validate(ct_config["quantization_config"])
scheme = qc.config_groups["group_0"]
check(qc.format == "nvfp4-pack-quantized" and scheme.weights.strategy == "tensor_group"
      and scheme.weights.group_size == 16 and scheme.input_activations is not None,
      f"compressed-tensors parses quantization_config: format {qc.format}, weights {scheme.weights.strategy}/"
      f"{scheme.weights.group_size}, inputs dynamic={scheme.input_activations.dynamic}")
ct = load_pt(os.path.join(exports["ct"], "model.safetensors"))
ct_dense = {}
codes_equal = scales_equal = True
ct_ulp = np.zeros(3, np.int64)  # counts of 0, 1, >2 ulp
explained = True
for m, ref in reference.items():
    packed, s, gs = ct[m + ".weight_packed"], ct[m + ".weight_scale"], ct[m + ".weight_global_scale"]
    n, k = ref.shape
    codes = unpack_fp4_from_uint8(packed, n, k, dtype=torch.float32)
    codes_equal &= bool(np.array_equal(codes.numpy(), E2M1[unpack_codes(mo[m + ".weight"])]))
    scales_equal &= bool(torch.equal(s.view(torch.uint8), mo[m + ".weight_scale"].view(torch.uint8)))
    w = dequantize(x_q=codes, scale=s.to(torch.float32), args=scheme.weights, global_scale=gs, dtype=torch.float32)
    ct_dense[m] = w
    d = ulps(w.numpy(), ref)
    ct_ulp += [int(np.sum(d == 0)), int(np.sum(d == 1)), int(np.sum(d > 2))]
    # Exactly explained: compressed-tensors computes code * (scale / global), nibble code * (scale * (1/global)).
    explained &= bool(np.array_equal(w.numpy().view(np.int32),
                                     (codes.numpy() * (np.repeat(s.to(torch.float32).numpy(), 16, axis=1)
                                                       / np.float32(gs.item()))).view(np.int32)))
    amax = np.float32(group_of[m][2])
    check(gs.dtype == torch.float32 and list(gs.shape) == [1] and gs.item() == np.float32(2688) / amax
          and np.float32(1) / np.float32(gs.item()) == mo[m + ".weight_scale_2"].item()
          and ct[m + ".input_global_scale"].item() == np.float32(1) / np.float32(mo[m + ".input_scale"].item())
          or abs(ct[m + ".input_global_scale"].item() * mo[m + ".input_scale"].item() - 1) < 1e-6,
          f"{m}: weight_global_scale {gs.item():.4f} = 2688/amax = 1/weight_scale_2; input_global_scale = 1/input_scale")
check(codes_equal and scales_equal, "compressed-tensors' unpack_fp4_from_uint8 reads nibble's codes; "
      "its E4M3 scales are the ModelOpt export's bytes")
check(explained, "compressed-tensors' dequantize is code * (scale / weight_global_scale) in FP32, bit for bit")
check(ct_ulp[2] == 0, f"compressed-tensors dequantize vs nibble's code * (scale * (1/global)): {ct_ulp[0]} equal, "
      f"{ct_ulp.sum() - ct_ulp[0] - ct_ulp[2]} 1-2 ulp apart (two roundings differ), {ct_ulp[2]} further")

# compressed-tensors' own ModelOpt -> compressed-tensors converter, on our ModelOpt export, must
# give our compressed-tensors export: same packed codes and E4M3 scales, global scales inverted
# (its 1/x of weight_scale_2 and ours of the encode scale may round 1 ulp apart).
from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter

converter = ModelOptNvfp4Converter(ignore=sorted(excluded), targets=["re:.*_proj$"])
converted = converter.validate(dict(mo))
same = all(torch.equal(converted[m + ".weight_packed"], ct[m + ".weight_packed"])
           and torch.equal(converted[m + ".weight_scale"].view(torch.uint8), ct[m + ".weight_scale"].view(torch.uint8))
           and abs(converted[m + ".weight_global_scale"].item() / ct[m + ".weight_global_scale"].item() - 1) <= 2 ** -23
           and abs(converted[m + ".input_global_scale"].item() / ct[m + ".input_global_scale"].item() - 1) <= 2 ** -23
           for m in reference)
check(same, f"compressed-tensors' ModelOptNvfp4Converter turns the ModelOpt export into the compressed-tensors one "
      f"({len(reference)} linears)")

# ---------------------------------------------------------------- excluded tensors
for name, exp in [("mo", "fp32"), ("ct", "fp32"), ("mo_bf16", "bf16")]:
    t = ct if name == "ct" else mo if name == "mo" else load_pt(os.path.join(exports[name], "model.safetensors"))
    bad = []
    dense = [k for k in fp32 if k[:-len(".weight")] not in reference]
    for k in dense:
        want = torch.from_numpy(fp32[k])
        if exp == "bf16":
            want = want.to(torch.bfloat16)
        if t[k].dtype != want.dtype or not torch.equal(t[k].view(torch.int16 if exp == "bf16" else torch.int32),
                                                       want.view(torch.int16 if exp == "bf16" else torch.int32)):
            bad.append(k)
    check(not bad, f"{name}: {len(dense)} excluded tensors equal the checkpoint's ({exp}){' except ' + str(bad[:3]) if bad else ''}")

# ---------------------------------------------------------------- end to end with transformers
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, CompressedTensorsConfig

with open(os.path.join(data, "val-00000.bin"), "rb") as f:
    raw = f.read()
magic, version, width, vocab, count = struct.unpack("<8sIIQQ", raw[:32])
val = np.frombuffer(raw[32:], dtype=np.uint16 if width == 2 else np.uint32).astype(np.int64)
seq, windows = config["max_position_embeddings"], 16
x = torch.from_numpy(np.stack([val[w * seq:w * seq + seq] for w in range(windows)]))
y = torch.from_numpy(np.stack([val[w * seq + 1:w * seq + seq + 1] for w in range(windows)]))


def loss_of(model):
    with torch.no_grad():
        logits = model(input_ids=x).logits
        lp = torch.log_softmax(logits.to(torch.float64) if logits.dtype == torch.float64 else logits, dim=-1)
        return float(-lp.gather(-1, y.unsqueeze(-1)).to(torch.float64).mean())


model = AutoModelForCausalLM.from_pretrained(exports["ct"], dtype=torch.float32, attn_implementation="eager",
                                             quantization_config=CompressedTensorsConfig(dequantize=True))
model.eval()
loss_loaded = loss_of(model)  # as transformers + compressed-tensors decompress it

# docs/export.md's snippets, run as written: the model they load is the one loaded above (the same
# tensors; attention left at transformers' default), and they generate from the prompt.
documented = run_doc_snippet("compressed-tensors", exports["ct"])
doc_state, test_state = documented["model"].state_dict(), model.state_dict()
check(doc_state.keys() == test_state.keys() and all(torch.equal(doc_state[k], test_state[k]) for k in doc_state)
      and documented["printed"].startswith("ROMEO:"),
      f"docs/export.md's compressed-tensors snippet loads the same weights ({len(doc_state)} tensors) and generates: "
      f"{documented['printed'][:40]!r}...")
loss_documented = loss_of(documented["model"])
documented_hf = run_doc_snippet("hf", exports["hf"])
hf_state = documented_hf["model"].state_dict()
check(all(k in hf_state and torch.equal(hf_state[k], torch.from_numpy(fp32[k])) for k in fp32)
      and documented_hf["printed"].startswith("ROMEO:"),
      f"docs/export.md's hf snippet loads the FP32 checkpoint's {len(fp32)} tensors bit for bit (--dtype fp32) and "
      f"generates: {documented_hf['printed'][:40]!r}...")
del documented, documented_hf
# compressed-tensors 0.20 unpacks to BF16 before dequantizing, so the dense weights transformers
# gets are the 4-bit values rounded to BF16; the same model with compressed-tensors' dequantize
# run in FP32 holds exactly the 4-bit values (ct_dense, checked against nibble's above).
loaded_vs_exact = max(float((model.get_submodule(m).weight.detach() - w).abs().max()) for m, w in ct_dense.items())
for m, w in ct_dense.items():
    model.get_submodule(m).weight.data.copy_(w)
loss_exact = loss_of(model)
loss_fp64 = loss_of(model.double())

tok = AutoTokenizer.from_pretrained(exports["ct"])
table = json.load(open(os.path.join(run_dir, "nibble_tokenizer.json")))["bytes"]
sample = corpus[1000:1400]
ids = tok(sample)["input_ids"]
check(ids == [table.index(ord(c)) for c in sample] and tok.decode(ids) == sample,
      f"AutoTokenizer ({type(tok).__name__}) encodes and decodes as nibble's character table")




def read_shard(path):
    with open(path, "rb") as f:
        raw = f.read()
    _, _, width, _, _ = struct.unpack("<8sIIQQ", raw[:32])
    return np.frombuffer(raw[32:], dtype=np.uint16 if width == 2 else np.uint32).astype(np.int64)


# A sentencepiece BPE run: AutoTokenizer on the export (a PreTrainedTokenizerFast of the converted
# tokenizer.json, which needs neither sentencepiece nor protobuf) must give the ids `nibble prepare`
# wrote for the whole corpus (its one input: train-00000.bin then val-00000.bin).
bpe_data, bpe_run = os.path.join(WORK, "bpe-data"), os.path.join(WORK, "bpe-run")
nibble("prepare", os.path.join(WORK, "corpus.txt"), "-o", bpe_data, "--tokenizer", "bpe", "--vocab-size", "400")
nibble("train", os.path.join(WORK, "tiny.yaml"), f"run.dir={bpe_run}", f"data.dir={bpe_data}", "steps=4")
nibble("export", bpe_run, "--format", "hf", "-o", os.path.join(WORK, "bpe-hf"))
bpe_tok = AutoTokenizer.from_pretrained(os.path.join(WORK, "bpe-hf"))
# (transformers 4 names the class PreTrainedTokenizerFast, 5 TokenizersBackend: both run tokenizer.json.)
check(type(bpe_tok).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend"),
      f"AutoTokenizer on the BPE export is a {type(bpe_tok).__name__}, not the fast tokenizer of its tokenizer.json")
bpe_ids = np.array(bpe_tok(corpus)["input_ids"])
want = np.concatenate([read_shard(os.path.join(bpe_data, "train-00000.bin")),
                       read_shard(os.path.join(bpe_data, "val-00000.bin"))])
check(bpe_ids.shape == want.shape and np.array_equal(bpe_ids, want) and bpe_tok.decode(bpe_ids[:500].tolist()) ==
      bpe_tok.decode(want[:500].tolist()),
      f"AutoTokenizer ({type(bpe_tok).__name__}) on the BPE export: {len(bpe_ids)} ids, nibble prepare wrote "
      f"{len(want)}, first difference at {next((i for i, (a, b) in enumerate(zip(bpe_ids, want)) if a != b), None)}")


def nibble_eval(*flags):
    out = nibble("eval", run_dir, "--max-windows", str(windows), "--json", *flags)
    return json.loads(out)["loss"]


loss_wq = nibble_eval("--weights-only-quantized")
loss_w4a4 = nibble_eval()
loss_fp32 = nibble_eval("--fp32")

# Tolerance: transformers and nibble compute the same FP32 function (the same weights, FP32 GEMMs,
# FP32 attention, softmax and norms) and differ only in the order of FP32 operations. A length-n
# FP32 sum in any order is within ~sqrt(n) u of exact (relative; u = 2^-24, the probabilistic
# bound of Higham & Mary, a constant of 4 for its high probability), and the loss goes through D
# such stages in sequence: per block rmsnorm, qkv, RoPE, QK^T, softmax, PV, o_proj, residual,
# rmsnorm, gate_up, SwiGLU, down, residual (13), then final norm, LM head, log-softmax and the mean
# (4). Independent rounding errors of a sequence of stages add in quadrature (the same model), and
# each implementation carries its own:
#   tol = 2 * 4 * sqrt(D * n_max) * u * |loss|, n_max the longest reduction (MLP hidden 192 here).
# The mean over the tokens would shrink it further; it is left out (the bound stays conservative).
u = 2.0 ** -24
D = 13 * L + 4
n_max = max(config["intermediate_size"], config["hidden_size"], config["vocab_size"], seq)
tol = 2 * 4 * math.sqrt(D * n_max) * u * abs(loss_wq)
check(abs(loss_exact - loss_fp64) < tol / 2,
      f"transformers' own FP32 error |FP32 - FP64| = {abs(loss_exact - loss_fp64):.2e} fits half the tolerance")
# The tolerance must be able to tell a wrong export: the same model with other weights (its FP32
# checkpoint, before the 4-bit rounding the export carries) must fall outside it. (The W4A4 recipe's
# loss, printed below, is no such yardstick: on this tiny model its distance to the weights-only loss
# is of the tolerance's size and depends on the run's bits, 7.8e-05 against 1.37e-04 on an AMX CPU.)
check(abs(loss_fp32 - loss_wq) > tol,
      f"the tolerance separates the FP32 checkpoint's loss ({abs(loss_fp32 - loss_wq):.2e} away, tol {tol:.2e})")
check(abs(loss_exact - loss_wq) < tol,
      f"transformers on the compressed-tensors export (exact 4-bit weights, FP32) {loss_exact:.7f} vs nibble eval "
      f"--weights-only-quantized {loss_wq:.7f}: |diff| {abs(loss_exact - loss_wq):.2e} < tol {tol:.2e}")
check(abs(loss_documented - loss_loaded) < tol,
      f"the documented load (default attention) {loss_documented:.7f} vs the eager one {loss_loaded:.7f}: "
      f"|diff| {abs(loss_documented - loss_loaded):.2e} < tol {tol:.2e}")
check(abs(loss_loaded - loss_exact) < 0.05,
      f"as transformers decompresses it (BF16-rounded 4-bit weights, max |dW| {loaded_vs_exact:.2e}) "
      f"{loss_loaded:.7f}: within 0.05 of the exact weights")

print(f"""
validation loss, first {windows} windows of {seq} tokens ({windows * seq} tokens), step 48 of the tiny run:
  transformers {transformers.__version__} + compressed-tensors, as loaded (dequantize=True)   {loss_loaded:.7f}
  transformers, compressed-tensors' dequantize in FP32 (exact 4-bit weights) {loss_exact:.7f}
  the same in FP64                                                           {loss_fp64:.7f}
  nibble eval --weights-only-quantized (FP32 GEMMs, 4-bit weights)           {loss_wq:.7f}
  nibble eval (the W4A4 NVFP4 recipe)                                        {loss_w4a4:.7f}
  nibble eval --fp32 (the FP32 checkpoint)                                   {loss_fp32:.7f}
  tolerance (derived) {tol:.2e}; |transformers - nibble| {abs(loss_exact - loss_wq):.2e}""")

if failures:
    print(f"\n{len(failures)} check(s) failed")
    sys.exit(1)
shutil.rmtree(WORK, ignore_errors=True)
print("\nall checks passed")
