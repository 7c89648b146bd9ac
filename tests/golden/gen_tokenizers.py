#!/usr/bin/env python3
"""Tokenizer goldens.

Writes into tests/golden/data/tokenizers/:
  bytelevel_bpe/tokenizer.json + golden.json   Llama-3-style byte-level BPE
  spm_bpe/tokenizer.json + golden.json         Llama-2-style SentencePiece BPE
                                               with byte fallback
  gpt2_bpe/tokenizer.json + golden.json        GPT-2-style byte-level BPE
  smollm2_gguf/golden_llamacpp.json            llama.cpp on the SmolLM2 GGUF vocab
  smollm2_gguf/golden_hf.json                  transformers' conversion of the
                                               same GGUF vocab, plus disagreements

The three tokenizer.json files are trained here with the HF `tokenizers`
library on tokenizer_train_text + the valid items of tokenizer_corpus, so they
are small and reproducible. Oracles: `tokenizers` for the tokenizer.json files,
llama-cpp-python and transformers for the GGUF vocabulary.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_DIR, SMOLLM2_GGUF, b64, pkg_version, rel, write_json  # noqa: E402
from tokenizer_corpus import CORPUS, VALID  # noqa: E402
from tokenizer_train_text import TRAIN_TEXT  # noqa: E402

OUT = DATA_DIR / "tokenizers"

# Pre-tokenization pattern of the Llama 3 tokenizer.json (Split, "isolated").
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

BYTELEVEL_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
SPM_SPECIALS = ["<unk>", "<s>", "</s>"]
GPT2_SPECIALS = ["<|endoftext|>"]


def training_texts() -> list[str]:
    paras = [p for p in TRAIN_TEXT.split("\n\n") if p]
    return paras + [b.decode("utf-8") for _, b in VALID if b]


def _special(tok: str) -> AddedToken:
    return AddedToken(tok, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)


def _reload(tok: Tokenizer) -> Tokenizer:
    return Tokenizer.from_str(tok.to_str())


# ---------------------------------------------------------------- builders
def build_bytelevel() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500 - len(BYTELEVEL_SPECIALS), min_frequency=1,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tok.train_from_iterator(training_texts(), trainer)
    # Like Llama 3: whole pre-tokens found in the vocabulary bypass the merges.
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = True
    tok = Tokenizer.from_str(json.dumps(j))
    # Specials go after the learned vocabulary, as in Llama 3.
    tok.add_special_tokens([_special(s) for s in BYTELEVEL_SPECIALS])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    return _reload(tok)


def build_gpt2() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000 - len(GPT2_SPECIALS), min_frequency=1,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tok.train_from_iterator(training_texts(), trainer)
    tok.add_special_tokens([_special(s) for s in GPT2_SPECIALS])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return _reload(tok)


def build_spm() -> Tokenizer:
    """SentencePiece-style BPE laid out like Llama 2's tokenizer.json.

    ids 0-2: <unk> <s> </s>; ids 3-258: byte tokens <0x00>..<0xFF>; then the
    learned pieces. Training splits words at "▁" (Metaspace) so no merge spans
    a word boundary; the shipped pipeline has no pre-tokenizer, only the
    Prepend("▁") + Replace(" ", "▁") normalizer, as Llama 2's file does.
    """
    train = Tokenizer(models.BPE(unk_token="<unk>"))
    train.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    n_learned = 800 - len(SPM_SPECIALS) - 256
    # Keep the 150 most frequent characters (ties by code point); the rest must
    # go through byte fallback. Choosing them here, and forcing exactly that
    # many, keeps the trainer's own tie-breaking out of the result.
    counts: dict[str, int] = {}
    for t in training_texts():
        for ch in t.replace(" ", "\u2581"):
            counts[ch] = counts.get(ch, 0) + 1
    counts["\u2581"] = counts.get("\u2581", 0) + 1
    alphabet = sorted(counts, key=lambda ch: (-counts[ch], ord(ch)))[:150]
    trainer = trainers.BpeTrainer(vocab_size=n_learned + len(SPM_SPECIALS), min_frequency=1,
                                  special_tokens=SPM_SPECIALS, initial_alphabet=alphabet,
                                  limit_alphabet=len(alphabet), show_progress=False)
    train.train_from_iterator(training_texts(), trainer)
    tj = json.loads(train.to_str())
    learned = sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab: dict[str, int] = {}
    for s in SPM_SPECIALS:
        vocab[s] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in learned:
        if piece in vocab:
            continue
        vocab[piece] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in tj["model"]["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                               byte_fallback=True, ignore_merges=False))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([_special(s) for s in SPM_SPECIALS])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                       special_tokens=[("<s>", vocab["<s>"])])
    return _reload(tok)


# ---------------------------------------------------------------- goldens
def hf_cases(tok: Tokenizer, specials: list[str]) -> list[dict]:
    cases = []
    for tag, raw in VALID:
        text = raw.decode("utf-8")
        for add in (False, True):
            enc = tok.encode(text, add_special_tokens=add)
            dec = tok.decode(enc.ids, skip_special_tokens=False)
            dec_skip = tok.decode(enc.ids, skip_special_tokens=True)
            cases.append({
                "tag": tag,
                "text_b64": b64(raw),
                "add_special_tokens": add,
                "parse_special": any(s in text for s in specials),
                "ids": enc.ids,
                "pieces": enc.tokens,
                "decoded_b64": b64(dec.encode("utf-8")),
                "decoded_skip_special_b64": b64(dec_skip.encode("utf-8")),
            })
    return cases


def write_hf_tokenizer(name: str, tok: Tokenizer, specials: list[str], notes: str) -> None:
    d = OUT / name
    d.mkdir(parents=True, exist_ok=True)
    path = d / "tokenizer.json"
    tok.save(str(path), pretty=True)
    tok = Tokenizer.from_file(str(path))  # goldens come from the file as shipped
    cases = hf_cases(tok, specials)
    write_json(d / "golden.json", {
        "producer": f"tests/golden/gen_tokenizers.py with tokenizers {pkg_version('tokenizers')}",
        "tokenizer": f"{name}/tokenizer.json",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "special_tokens": {s: tok.token_to_id(s) for s in specials},
        "notes": notes,
        "parse_special_note": ("the tokenizers library always splits registered special tokens out of "
                               "the input text; parse_special marks cases whose text contains one"),
        "cases": cases,
    })
    print(f"  {name}: vocab {tok.get_vocab_size()} file {path.stat().st_size} bytes, {len(cases)} cases")


def gen_llamacpp(out: Path) -> dict | None:
    try:
        from llama_cpp import Llama
    except Exception as e:  # pragma: no cover
        print(f"  llama-cpp-python unavailable ({e}); golden_llamacpp.json not regenerated")
        return None
    m = Llama(model_path=str(SMOLLM2_GGUF), vocab_only=True, verbose=False)
    cases = []
    for tag, raw in CORPUS:
        ids = m.tokenize(raw, add_bos=False, special=False)
        ids_sp = m.tokenize(raw, add_bos=False, special=True)
        ids_bos = m.tokenize(raw, add_bos=True, special=False)
        cases.append({
            "tag": tag,
            "text_b64": b64(raw),
            "valid_utf8": (tag, raw) in VALID,
            "ids": ids,
            "ids_parse_special": ids_sp,
            "ids_add_bos": ids_bos,
            "detok_b64": b64(m.detokenize(ids)),
            "detok_parse_special_b64": b64(m.detokenize(ids_sp, special=True)),
            "detok_parse_special_unrendered_b64": b64(m.detokenize(ids_sp, special=False)),
        })
    doc = {
        "producer": (f"tests/golden/gen_tokenizers.py with llama-cpp-python {pkg_version('llama_cpp_python')} "
                     "(Llama(vocab_only=True))"),
        "model": rel(SMOLLM2_GGUF),
        "conventions": {
            "ids": "tokenize(text, add_bos=False, special=False): special-token text is plain text",
            "ids_parse_special": "tokenize(text, add_bos=False, special=True): special/control token text is parsed",
            "ids_add_bos": "tokenize(text, add_bos=True, special=False): BOS only if the vocab asks for it",
            "detok_b64": "detokenize(ids)",
            "detok_parse_special_b64": "detokenize(ids_parse_special, special=True): control tokens rendered",
            "detok_parse_special_unrendered_b64": "detokenize(ids_parse_special, special=False): control tokens dropped",
        },
        "cases": cases,
    }
    write_json(out / "golden_llamacpp.json", doc)
    print(f"  smollm2_gguf/golden_llamacpp.json: {len(cases)} cases")
    return doc


def gen_hf_gguf(out: Path, llama_doc: dict | None) -> None:
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name)
    except Exception as e:
        print(f"  transformers could not load the GGUF tokenizer ({type(e).__name__}: {e}); "
              "golden_hf.json not regenerated")
        return
    cases = []
    for tag, raw in VALID:
        text = raw.decode("utf-8")
        ids = tok.encode(text, add_special_tokens=False)
        ids_add = tok.encode(text, add_special_tokens=True)
        cases.append({
            "tag": tag,
            "text_b64": b64(raw),
            "ids": ids,
            "ids_add_special_tokens": ids_add,
            "pieces": tok.convert_ids_to_tokens(ids),
            "decoded_b64": b64(tok.decode(ids, skip_special_tokens=False).encode("utf-8")),
        })
    disagreements = []
    if llama_doc is not None:
        by_tag = {c["tag"]: c for c in llama_doc["cases"]}
        for c in cases:
            lc = by_tag[c["tag"]]
            entry = {}
            if c["ids"] != lc["ids_parse_special"]:
                entry["ids"] = {"llamacpp_parse_special": lc["ids_parse_special"], "hf": c["ids"]}
            if c["decoded_b64"] != lc["detok_parse_special_b64"]:
                entry["decode"] = {"llamacpp_b64": lc["detok_parse_special_b64"], "hf_b64": c["decoded_b64"]}
            if entry:
                disagreements.append({"tag": c["tag"], "text_b64": c["text_b64"], **entry})
    backend = getattr(tok, "backend_tokenizer", None)
    pipeline = None
    if backend is not None:
        bj = json.loads(backend.to_str())
        pipeline = {k: bj.get(k) for k in ("normalizer", "pre_tokenizer", "post_processor", "decoder")}
    write_json(out / "golden_hf.json", {
        "producer": (f"tests/golden/gen_tokenizers.py with transformers {pkg_version('transformers')}, "
                     f"tokenizers {pkg_version('tokenizers')}: AutoTokenizer.from_pretrained(gguf_file=...)"),
        "model": rel(SMOLLM2_GGUF),
        "tokenizer_class": type(tok).__name__,
        "hf_pipeline": pipeline,
        "conventions": {
            "ids": "encode(text, add_special_tokens=False); special tokens in the text are always parsed",
            "ids_add_special_tokens": "encode(text, add_special_tokens=True)",
            "decoded_b64": "decode(ids, skip_special_tokens=False)",
            "disagreements": ("valid-UTF-8 items where ids differ from llama.cpp ids_parse_special, or "
                              "decoded text differs from llama.cpp detok_parse_special_b64"),
        },
        "cases": cases,
        "disagreements": disagreements,
    })
    print(f"  smollm2_gguf/golden_hf.json: {len(cases)} cases, {len(disagreements)} disagreements")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    write_hf_tokenizer("bytelevel_bpe", build_bytelevel(), BYTELEVEL_SPECIALS,
                       "Llama-3-style: Split(Llama-3 regex, isolated) + ByteLevel(use_regex=false); "
                       "BPE ignore_merges=true; TemplateProcessing prepends <|begin_of_text|>")
    write_hf_tokenizer("spm_bpe", build_spm(), SPM_SPECIALS,
                       "Llama-2-style: normalizer Prepend(U+2581)+Replace(' ', U+2581), no pre-tokenizer, "
                       "BPE byte_fallback=true fuse_unk=true; TemplateProcessing prepends <s>")
    write_hf_tokenizer("gpt2_bpe", build_gpt2(), GPT2_SPECIALS,
                       "GPT-2-style: ByteLevel(add_prefix_space=false, use_regex=true); no BOS")
    if not SMOLLM2_GGUF.exists():
        print(f"  {SMOLLM2_GGUF} missing: SmolLM2 tokenizer goldens skipped")
        return
    out = OUT / "smollm2_gguf"
    out.mkdir(parents=True, exist_ok=True)
    doc = gen_llamacpp(out)
    if doc is None and (out / "golden_llamacpp.json").exists():
        doc = json.loads((out / "golden_llamacpp.json").read_text())
    gen_hf_gguf(out, doc)


if __name__ == "__main__":
    main()
