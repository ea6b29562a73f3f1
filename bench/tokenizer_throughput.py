"""Encoding throughput of `nibble prepare --tokenizer tokenizer.json` next to Hugging Face `tokenizers`
(encode_batch) and tiktoken (encode_ordinary_batch) on the same text, on THREADS threads each.
The tokenizer is a GPT-2-style byte-level BPE (ByteLevel pre-tokenizer, the GPT-2 pattern) trained
here with `tokenizers`; tiktoken gets the same vocabulary as ranks and the same pattern.
    bench/tokenizer_throughput.py NIBBLE_BINARY WORK_DIR [MB] [THREADS] [VOCAB] [DOCUMENT_KB]
Run in a venv with tokenizers and tiktoken (ctest's BUILD/tokenizer_venv has them)."""
import base64
import json
import os
import shutil
import subprocess
import sys
import time

nibble, work = sys.argv[1], sys.argv[2]
mb = int(sys.argv[3]) if len(sys.argv) > 3 else 32
threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
vocab_size = int(sys.argv[5]) if len(sys.argv) > 5 else 32000
document_kb = int(sys.argv[6]) if len(sys.argv) > 6 else 1000
os.environ["RAYON_NUM_THREADS"] = str(threads)
os.environ["TOKENIZERS_PARALLELISM"] = "true"
import tiktoken  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tinyshakespeare.txt")
base = open(src, encoding="utf-8").read()
os.makedirs(work, exist_ok=True)
# Copies of Shakespeare with each copy's words shifted, so the text does not simply repeat, cut into
# documents of DOCUMENT_KB (at a space).
copies = []
words = base.split(" ")
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

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator([base], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                    show_progress=False))
path = os.path.join(work, "tokenizer.json")
tok.save(path)
tok = Tokenizer.from_file(path)

inputs = []
for i, d in enumerate(docs):
    p = os.path.join(work, "doc%05d.txt" % i)
    with open(p, "w", encoding="utf-8") as f:
        f.write(d)
    inputs.append(p)


def report(name, seconds, tokens):
    print("%-34s %6.2f s  %7.1f MB/s  %6.2f M tokens/s  (%d tokens)" % (name, seconds, total_bytes / seconds / 1e6,
                                                                        tokens / seconds / 1e6, tokens))


for old in os.listdir(work):
    if old.startswith("doc") and os.path.join(work, old) not in inputs:
        os.remove(os.path.join(work, old))
out = os.path.join(work, "data")
shutil.rmtree(out, ignore_errors=True)
t = time.perf_counter()
subprocess.run([nibble, "prepare", *inputs, "-o", out, "--tokenizer", path, "--threads", str(threads)], check=True,
               stdout=subprocess.DEVNULL)
nibble_s = time.perf_counter() - t
with open(os.path.join(out, "prepare.json")) as f:
    record = json.load(f)
nibble_tokens = record["train_tokens"] + record["val_tokens"] - len(docs)  # less one end-of-text per document

t = time.perf_counter()
hf = tok.encode_batch(docs)
hf_s = time.perf_counter() - t
hf_tokens = sum(len(e.ids) for e in hf)

byte_decoder = {c: b for b, c in zip(range(256), [None] * 256)}
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs = bs[:] + [256 + n for n in range(256 - len(bs))]
bs += [b for b in range(256) if b not in bs]
char_to_byte = {chr(c): b for b, c in zip(bs, cs)}
ranks = {bytes(char_to_byte[ch] for ch in token): i for token, i in tok.get_vocab().items() if token != "<|endoftext|>"}
enc = tiktoken.Encoding("bench", pat_str=r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
                        mergeable_ranks=ranks, special_tokens={})
t = time.perf_counter()
tk = enc.encode_ordinary_batch(docs, num_threads=threads)
tk_s = time.perf_counter() - t
tk_tokens = sum(len(x) for x in tk)

print("%.1f MB in %d documents, vocabulary %d, %d threads" % (total_bytes / 1e6, len(docs), tok.get_vocab_size(), threads))
report("nibble prepare (whole command)", nibble_s, nibble_tokens)
report("tokenizers encode_batch", hf_s, hf_tokens)
report("tiktoken encode_ordinary_batch", tk_s, tk_tokens)
