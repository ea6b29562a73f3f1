"""ctest tokenizer_reference_ids: `nibble prepare --tokenizer FILE` gives, id for id, what the
reference library gives for each document (followed by the end-of-text id), on a multilingual,
emoji- and whitespace-heavy corpus written here, for tokenizers built here:
  - a byte-level BPE trained with HF `tokenizers` with the GPT-2 ByteLevel pre-tokenizer;
  - the same with a Llama-3-style Split regex + ByteLevel(use_regex=false) and a BOS template;
  - a Qwen-2-style one: NFC normalizer, Split + ByteLevel;
  - sentencepiece-style BPE with byte_fallback, fuse_unk and the 256 <0xNN> tokens (Llama 2,
    TinyLlama, Mistral as tokenizer.json), built from a BPE trained here: Llama 2's Prepend("▁") +
    Replace(" ", "▁") normalizer and no pre-tokenizer (each document one piece), and Metaspace
    pre-tokenizers (prepend_scheme first without split, as Mistral's legacy=false; always and never
    with split), each with <s> $A and Llama's decoder; characters left out of the alphabet fall back
    to their bytes; their corpus adds texts with <s> </s> <unk> inside and 400 random short ones;
  - sentencepiece BPE models trained here (Llama 2's settings; NFKC + dummy prefix), each document
    as <s> + sp.encode(text) + </s>;
  - a tiktoken encoding of custom ranks (tiktoken.Encoding) written as a .tiktoken file, with the
    patterns of r50k_base, cl100k_base and o200k_base: encode_ordinary(text) + <|endoftext|>;
  - for the Hugging Face and tiktoken runs, `nibble export`'s tokenizer opened with AutoTokenizer;
and that nibble's decode of those ids is the text (via `nibble generate`-free route: the shard
tokens decoded by the reference must be the corpus, and nibble's own decode is checked by the C++
unit tests). Exit 1 with the first difference named.
    test_reference_ids.py SOURCE_DIR WORK_DIR NIBBLE_BINARY
"""
import json
import os
import shutil
import struct
import subprocess
import sys

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers, decoders, processors, Regex

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Documents: each becomes one input file. Scripts, combining marks, emoji ZWJ sequences, tabs,
# runs of spaces, CRLF, digits, NEL (U+0085) and other Unicode spaces, contractions in both cases.
DOCUMENTS = [
    "Hello world! It's 2026; we'll see. DON'T SHOUT.  Two  spaces,   three.\n\tTabbed\tline\r\nCRLF line\r\n",
    "日本語のテキストです。中文文本，包括标点符号。한국어 문장도 있습니다.\n",
    "النص العربي مع الأرقام ١٢٣ و 456.\nעברית גם כן.\n",
    "Combining: e\u0301 a\u0308 n\u0303 — Zalgo: Z\u0351\u0307a\u0365l\u0366g\u0368o\u0311.\n",
    "Emoji: 👩‍👩‍👧‍👦 👍🏽 🏳️‍🌈 🇯🇵 ❤️ 🧑‍💻!!!\n",
    "Numbers 1234567890 3.14159 1e-9 0x1F600 12,345,678\n",
    "Whitespace\u00a0nbsp\u2003em\u3000ideographic\u0085nel\u2028ls   \n\n\n    indented\n\t\t\ttabs  \n",
    # U+180E is no whitespace to Oniguruma and Rust's regex but is to PCRE2's \s; NEL is to all.
    "MVS after a space: a \u180eb, two  \u180e\u180e x, end \u180e; NEL: a \u0085b \u0085\n",
    "Mixed: naïve café résumé Ærøskøbing straße ﬁ ligature ſ long-s KELVIN\u212a 'S 'Ll\n",
    "code: def f(x):\n    return x**2  # comment\n\nif __name__ == '__main__':\n\tprint(f(3))\n",
    "<|endoftext|> inside the text, and <|begin_of_text|> too\n",
    "    \n   leading and trailing spaces   ",
    "Русский текст. Ελληνικά. ภาษาไทย. हिन्दी देवनागरी.\n",
]


# Encoded but not trained on: pieces the merges must build rather than find whole.
UNSEEN = [
    "Quick brown foxes jump over lazy dogs; Jackdaws love my big sphinx of quartz.\n" * 3,
    " " * 100 + "x" + "\t" * 17 + "\r\n" * 5 + "\n" * 9,
    "9876543210 0.000001 ١٢٣٤٥ 一二三 ½ ² ⅷ\n",
    "🤷🏻‍♀️🤦🏿‍♂️👨‍👩‍👧 ✊🏾✌🏼 家族👪 مرحبا👋 ẞ ǅ ﬀ Å ﹏ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢\n",
    "it'ſ odd: IT'ſ, ſ'S, Kelvin'\u212a \n",
    "I'M HERE, YOU'RE THERE, WE'VE GOT IT, SHE'D SAY, HE'LL GO, IT'S FINE. i'm, you're\n",
    "",
]
# One large document: enough pre-tokens (> 2 x 16384) that nibble encodes it on 2 threads, each
# with its cache of repeated pieces.
UNSEEN.append("".join(DOCUMENTS + UNSEEN) * 150)


# For the Llama-style tokenizers, whose added tokens are <unk> <s> </s>: text after an added token
# is a span of its own (normalized, given Metaspace's ▁ or not, on its own).
LLAMA_SPECIAL = ["Text<s> inside</s> and </s>after, <unk> too\n", "</s>  leading </s>", "<s>", " <s> x</s>"]


def random_documents(n=400, seed=28):
    """Short texts drawn from the corpus's characters, runs of spaces, ▁ itself, <s> </s> <unk>,
    <0x41> as text, combining marks, emoji: where spans, prepends and byte fallback meet."""
    import random
    rng = random.Random(seed)
    pieces = sorted(set("".join(DOCUMENTS))) + [" "] * 20 + ["\n", "\t", "<s>", "</s>", "<unk>", "▁", "▁▁", "😀",
                                                          "𝔘", "\u0301", "\u00a0", "\u3000", "  ", "<0x41>", "é"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 40))) for _ in range(n)]


def train_corpus():
    # Enough repetition for merges across all scripts.
    return [d * 3 for d in DOCUMENTS] * 20


def gpt2_style(special):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_corpus(), trainer)
    return tok


def llama3_style():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_corpus(), trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    return tok


def qwen_style():
    """Qwen 2's shape: an NFC normalizer before a Split regex + ByteLevel(use_regex=false)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_corpus(), trainer)
    return tok


def byte_fallback_style(name, normalizer, pre_tokenizer, decoder):
    """A Llama-2-style tokenizer.json: a BPE trained here on the corpus as `normalizer` and
    `pre_tokenizer` see it (alphabet limited, so rarer characters take the byte fallback), rebuilt
    with <unk> <s> </s> and <0x00>..<0xFF> first, as Llama 2's vocabulary is laid out."""
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = normalizer
    trained.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=120)
    trained.train_from_iterator(train_corpus(), trainer)
    model = json.loads(trained.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for token, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoder
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def llama2_decoder():
    return decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                              decoders.Strip(" ", 1, 0)])


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"NIBTOKNS", path
    _, width, vocab, count = struct.unpack("<IIQQ", data[8:32])
    fmt = "<%d%s" % (count, "H" if width == 2 else "I")
    return list(struct.unpack(fmt, data[32:32 + count * width])), vocab


def prepare(nibble, work, name, tokenizer_path, docs, extra=()):
    inputs = []
    for i, d in enumerate(docs):
        p = os.path.join(work, "%s_doc%02d.txt" % (name, i))
        with open(p, "w", encoding="utf-8", newline="") as f:
            f.write(d)
        inputs.append(p)
    out = os.path.join(work, name + "_data")
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run([nibble, "prepare", *inputs, "-o", out, "--tokenizer", tokenizer_path, "--threads", "2", *extra],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("FAIL: nibble prepare with %s exited %d: %s%s" % (tokenizer_path, r.returncode, r.stdout, r.stderr))
    return prepared_ids(out) + (out,)


def prepared_ids(out):
    """The ids of every document in input order: each source's training part, then its validation
    part (prepare splits each input file; prepare.json lists the shards and each source's counts)."""
    with open(os.path.join(out, "prepare.json")) as f:
        record = json.load(f)
    parts, vocab = {}, None
    for role in ("train", "val"):
        parts[role] = []
        for shard in record["shards"][role]:
            ids, vocab = read_shard(os.path.join(out, shard["file"]))
            parts[role] += ids
    ids, at = [], {"train": 0, "val": 0}
    for source in record["sources"]:
        for role in ("train", "val"):
            n = source[role + "_tokens"]
            ids += parts[role][at[role]:at[role] + n]
            at[role] += n
    return ids, vocab


def check(name, got, expected):
    if got == expected:
        return
    n = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    sys.exit("FAIL: %s: nibble's ids differ from the reference at token %d (of %d vs %d): nibble %s, reference %s"
             % (name, n, len(got), len(expected), got[max(0, n - 3):n + 5], expected[max(0, n - 3):n + 5]))


def check_huggingface(nibble, work, name, tok, eot_name, byte_fallback=False):
    path = os.path.join(work, name + ".json")
    tok.save(path)
    ref = Tokenizer.from_file(path)  # as a user's file is read
    eot = ref.token_to_id(eot_name)
    docs = DOCUMENTS + UNSEEN + (LLAMA_SPECIAL + random_documents() if byte_fallback else [])
    expected = []
    for d in docs:
        ids = ref.encode(d).ids
        plain = ref.encode(d, add_special_tokens=False).ids
        # A normalizer's text comes back normalized (NFC), as nibble's decode gives it too. Byte
        # fallback ones decode to the text itself (Metaspace's "first" loses a leading space).
        if not byte_fallback:
            text = ref.normalizer.normalize_str(d) if ref.normalizer else d
            assert ref.decode(plain, skip_special_tokens=False) == text, "reference round trip of %r" % d
        expected += ids + [eot]
    got, vocab, out = prepare(nibble, work, name, path, docs)
    check(name, got, expected)
    if vocab != ref.get_vocab_size(with_added_tokens=True):
        sys.exit("FAIL: %s: shard vocabulary %d, reference %d" % (name, vocab, ref.get_vocab_size(True)))
    with open(os.path.join(out, "tokenizer.json"), "rb") as a, open(path, "rb") as b:
        if a.read() != b.read():
            sys.exit("FAIL: %s: the data directory's tokenizer.json is not the given file" % name)
    print("ok: %s: %d tokens id for id (end of text %s = %d)" % (name, len(got), eot_name, eot))
    check_export(nibble, work, name, out, lambda d: ref.encode(d).ids)


def check_export(nibble, work, name, data_dir, reference):
    """Trains 2 steps on DATA_DIR, exports (--format hf) and opens the export's tokenizer with
    transformers' AutoTokenizer, as a user would in a plain venv: its ids must be the reference's."""
    from transformers import AutoTokenizer
    config = os.path.join(work, name + "_config.yaml")
    with open(config, "w") as f:
        f.write("data:\n  dir: %s\nsteps: 2\nbatch: 2\nquantization: nvfp4\nmodel:\n  layers: 1\n  heads: 2\n"
                "  width: 32\n  context: 32\nschedule:\n  warmup_steps: 1\nthreads: 2\n" % data_dir)
    run_dir, export_dir = os.path.join(work, name + "_run"), os.path.join(work, name + "_export")
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(export_dir, ignore_errors=True)
    for command in (["train", config, "run.dir=" + run_dir], ["export", run_dir, "-o", export_dir, "--format", "hf"]):
        r = subprocess.run([nibble, *command], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("FAIL: %s: nibble %s exited %d: %s%s" % (name, command[0], r.returncode, r.stdout, r.stderr))
    auto = AutoTokenizer.from_pretrained(export_dir)
    for d in DOCUMENTS + UNSEEN[:-1]:
        if auto(d)["input_ids"] != reference(d):
            sys.exit("FAIL: %s: AutoTokenizer on the export gives %s for %r, the reference %s"
                     % (name, auto(d)["input_ids"], d, reference(d)))
    print("ok: %s: the export's tokenizer (AutoTokenizer) gives the reference's ids" % name)


def check_sentencepiece(nibble, work, name, **options):
    import sentencepiece as spm
    prefix = os.path.join(work, name)
    corpus = os.path.join(work, name + "_corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(train_corpus()))
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=800, character_coverage=1.0, hard_vocab_limit=False,
                                   minloglevel=2, **options)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    expected = []
    for d in DOCUMENTS + UNSEEN:
        expected += [sp.bos_id()] + sp.encode(d) + [sp.eos_id()]
    got, vocab, out = prepare(nibble, work, name, prefix + ".model", DOCUMENTS + UNSEEN)
    check(name, got, expected)
    if vocab != sp.get_piece_size():
        sys.exit("FAIL: %s: shard vocabulary %d, reference %d" % (name, vocab, sp.get_piece_size()))
    print("ok: %s: %d tokens id for id (each document in <s> %d ... </s> %d)" % (name, len(got), sp.bos_id(),
                                                                               sp.eos_id()))


def openai_patterns():
    """The pattern of each of OpenAI's encodings, from tiktoken itself (its ranks are not downloaded)."""
    import tiktoken_ext.openai_public as public
    public.load_tiktoken_bpe = lambda *args, **kwargs: {}
    return {name: getattr(public, name)()["pat_str"] for name in ("r50k_base", "cl100k_base", "o200k_base")}


def check_tiktoken(nibble, work, hf_tokenizer):
    import base64
    import tiktoken
    # Custom ranks: the byte-level tokens of a BPE trained here, in id order (bytes first).
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:] + [256 + n for n in range(256 - len(bs))]
    bs += [b for b in range(256) if b not in bs]
    byte_of = {chr(c): b for b, c in zip(bs, cs)}
    vocab = sorted(hf_tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    tokens = [bytes(byte_of[ch] for ch in t) for t, _ in vocab if all(ch in byte_of for ch in t) and t != "<|endoftext|>"]
    ranks = {t: i for i, t in enumerate(tokens)}
    path = os.path.join(work, "custom.tiktoken")
    with open(path, "w") as f:
        for t, r in ranks.items():
            f.write("%s %d\n" % (base64.b64encode(t).decode(), r))
    for name, pattern in openai_patterns().items():
        eot = len(ranks)
        enc = tiktoken.Encoding("custom_" + name, pat_str=pattern, mergeable_ranks=ranks,
                                special_tokens={"<|endoftext|>": eot})
        expected = []
        for d in DOCUMENTS + UNSEEN:
            ids = enc.encode_ordinary(d)
            assert enc.decode_bytes(ids) == d.encode()
            expected += ids + [eot]
        got, vocab_size, out = prepare(nibble, work, "tiktoken_" + name, path, DOCUMENTS + UNSEEN,
                                       ["--tiktoken-encoding", name])
        check("tiktoken " + name, got, expected)
        if vocab_size != enc.n_vocab:
            sys.exit("FAIL: tiktoken %s: shard vocabulary %d, reference %d" % (name, vocab_size, enc.n_vocab))
        print("ok: tiktoken with %s's pattern, %d custom ranks: %d tokens id for id (<|endoftext|> = %d)"
              % (name, len(ranks), len(got), eot))
        # The export converts it to a tokenizer.json, where special-token text is special (as
        # tiktoken's encode with allowed_special="all").
        check_export(nibble, work, "tiktoken_" + name, out, lambda d: enc.encode(d, allowed_special="all"))


def main():
    src, work, nibble = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    gpt2 = gpt2_style(["<|endoftext|>"])
    check_huggingface(nibble, work, "hf_gpt2_bytelevel", gpt2, "<|endoftext|>")
    check_huggingface(nibble, work, "hf_llama3_split", llama3_style(), "<|end_of_text|>")
    check_huggingface(nibble, work, "hf_qwen_nfc", qwen_style(), "<|endoftext|>")
    llama2 = byte_fallback_style("llama2", normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
                                 None, llama2_decoder())
    check_huggingface(nibble, work, "hf_llama2_byte_fallback", llama2, "</s>", byte_fallback=True)
    mistral = byte_fallback_style("mistral", None, pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=False),
                                  llama2_decoder())
    check_huggingface(nibble, work, "hf_mistral_metaspace_first", mistral, "</s>", byte_fallback=True)
    split = byte_fallback_style("metaspace", None, pre_tokenizers.Metaspace("▁", prepend_scheme="always", split=True),
                                decoders.Metaspace("▁", prepend_scheme="always", split=True))
    check_huggingface(nibble, work, "hf_metaspace_always_split", split, "</s>", byte_fallback=True)
    never = byte_fallback_style("never", None, pre_tokenizers.Metaspace("▁", prepend_scheme="never", split=True),
                                llama2_decoder())
    check_huggingface(nibble, work, "hf_metaspace_never_split", never, "</s>", byte_fallback=True)
    # Llama 2's settings (BPE, byte fallback, digits split, identity normalization), and BPE with
    # sentencepiece's default NFKC normalization and dummy prefix. (A unigram model is left out:
    # Debian's libsentencepiece 0.1.97 breaks ties between equal-score segmentations, "!" "!!" vs
    # "!!" "!", otherwise than PyPI's >= 0.1.98, so its ids are that library's, not PyPI's.)
    check_sentencepiece(nibble, work, "spm_llama2_bpe", model_type="bpe", byte_fallback=True, split_digits=True,
                        normalization_rule_name="identity")
    check_sentencepiece(nibble, work, "spm_bpe_nfkc", model_type="bpe")
    check_tiktoken(nibble, work, gpt2)


if __name__ == "__main__":
    main()
