"""Encoding throughput of `nibble prepare --tokenizer tokenizer.json` next to Hugging Face `tokenizers`
(encode_batch) on the same text, THREADS threads each, for a Llama-2-style tokenizer.json: BPE with
byte_fallback and the 256 <0xNN> tokens, the Prepend("▁") + Replace(" ", "▁") normalizer and no
pre-tokenizer, so that each document is one piece (the case nibble's heap-based merge loop is for).
The merges are learned here by `tokenizers` (on words, through a Metaspace pre-tokenizer, as
sentencepiece learns within words). The ids nibble writes are checked equal to the reference's.
    bench/tokenizer_throughput_byte_fallback.py NIBBLE_BINARY WORK_DIR [MB] [THREADS] [VOCAB] [DOCUMENT_KB]
Run in a venv with tokenizers (ctest's BUILD/tokenizer_venv has it)."""
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import time

nibble, work = sys.argv[1], sys.argv[2]
mb = int(sys.argv[3]) if len(sys.argv) > 3 else 16
threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
vocab_size = int(sys.argv[5]) if len(sys.argv) > 5 else 32000
document_kb = int(sys.argv[6]) if len(sys.argv) > 6 else 100
os.environ["RAYON_NUM_THREADS"] = str(threads)
os.environ["TOKENIZERS_PARALLELISM"] = "true"
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tinyshakespeare.txt")
base = open(src, encoding="utf-8").read()
os.makedirs(work, exist_ok=True)
# Copies of Shakespeare with each copy's words shifted, cut into documents of DOCUMENT_KB (at a space).
copies, words = [], base.split(" ")
while sum(len(d) for d in copies) < mb * 1_000_000:
    k = len(copies)
    copies.append(" ".join(words[k * 7919 % len(words):] + words[:k * 7919 % len(words)]))
docs = []
for c in copies:
    start = 0
    while start < len(c):
        end = c.find(" ", start + document_kb * 1000)
        end = len(c) if end < 0 else end
        docs.append(c[start:end])
        start = end
total_bytes = sum(len(d.encode()) for d in docs)

trained = Tokenizer(models.BPE(unk_token="<unk>"))
trained.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="always", split=True)
trained.train_from_iterator([base], trainers.BpeTrainer(vocab_size=vocab_size - 256, special_tokens=["<unk>", "<s>", "</s>"],
                                                        show_progress=False))
model = json.loads(trained.to_str())["model"]
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for b in range(256):
    vocab["<0x%02X>" % b] = len(vocab)
for token, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]):
    vocab.setdefault(token, len(vocab))
merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                 decoders.Strip(" ", 1, 0)])
tok.add_special_tokens(["<unk>", "<s>", "</s>"])
tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
path = os.path.join(work, "tokenizer.json")
tok.save(path)
tok = Tokenizer.from_file(path)

inputs = []
for i, d in enumerate(docs):
    p = os.path.join(work, "doc%05d.txt" % i)
    with open(p, "w", encoding="utf-8") as f:
        f.write(d)
    inputs.append(p)
for old in os.listdir(work):
    if old.startswith("doc") and os.path.join(work, old) not in inputs:
        os.remove(os.path.join(work, old))


def report(name, seconds, cpu, tokens):
    """`cpu`: CPU seconds (user + system) on all threads: steadier than wall time on a shared machine."""
    print("%-34s %6.2f s  %7.1f MB/s  %6.2f M tokens/s  (%d tokens; %.2f CPU s, %.2f MB per CPU s)"
          % (name, seconds, total_bytes / seconds / 1e6, tokens / seconds / 1e6, tokens, cpu, total_bytes / cpu / 1e6))


def cpu_seconds(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def shard(p):
    data = open(p, "rb").read()
    _, width, _, count = struct.unpack("<IIQQ", data[8:32])
    return list(struct.unpack("<%d%s" % (count, "H" if width == 2 else "I"), data[32:32 + count * width]))


out = os.path.join(work, "data")
shutil.rmtree(out, ignore_errors=True)
t, c = time.perf_counter(), cpu_seconds(resource.RUSAGE_CHILDREN)
subprocess.run([nibble, "prepare", *inputs, "-o", out, "--tokenizer", path, "--threads", str(threads)], check=True,
               stdout=subprocess.DEVNULL)
nibble_s, nibble_cpu = time.perf_counter() - t, cpu_seconds(resource.RUSAGE_CHILDREN) - c
# Each input is split on its own (the last tenth validates): its ids are its train part then its val part.
with open(os.path.join(out, "prepare.json")) as f:
    record = json.load(f)
train_ids = [i for s in record["shards"]["train"] for i in shard(os.path.join(out, s["file"]))]
val_ids = [i for s in record["shards"]["val"] for i in shard(os.path.join(out, s["file"]))]
nibble_ids = []
for source in record["sources"]:
    nibble_ids += train_ids[:source["train_tokens"]] + val_ids[:source["val_tokens"]]
    train_ids, val_ids = train_ids[source["train_tokens"]:], val_ids[source["val_tokens"]:]

t, c = time.perf_counter(), cpu_seconds(resource.RUSAGE_SELF)
hf = tok.encode_batch(docs)
hf_s, hf_cpu = time.perf_counter() - t, cpu_seconds(resource.RUSAGE_SELF) - c
hf_ids = [i for e in hf for i in e.ids + [2]]

print("%.1f MB in %d documents of %d kB (each one piece), vocabulary %d, %d threads" %
      (total_bytes / 1e6, len(docs), document_kb, tok.get_vocab_size(), threads))
report("nibble prepare (whole command)", nibble_s, nibble_cpu, len(nibble_ids) - len(docs))
report("tokenizers encode_batch", hf_s, hf_cpu, len(hf_ids) - len(docs))
print("ids equal:", nibble_ids == hf_ids)
