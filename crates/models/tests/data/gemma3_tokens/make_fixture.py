"""Expected Gemma 3 token ids for `tests/models/gemma3_tokenizer.rs`, from tokenizers that share
no code with `src/tokenizer/spm.rs` (nor with each other): sentencepiece, transformers and,
where installed, llama.cpp.

Run from the workspace root after `scripts/fetch-models` (Python 3.11; sentencepiece 0.2.3,
protobuf 7.36.2, gguf 0.19.0, transformers 5.23.0 with tokenizers 0.23.3, no torch; ~1 minute):

    python3 -m pip install sentencepiece==0.2.3 protobuf==7.36.2 gguf==0.19.0 \
        transformers==5.23.0 tokenizers==0.23.3
    python3 crates/models/tests/data/gemma3_tokens/make_fixture.py \
        model-cache/gemma3/gemma-3-270m-q4_k_m.gguf \
        crates/models/tests/data/gemma3_tokens/expected.json

The tokenizers:

1. Google's `sentencepiece` (the C++ library Gemma's tokenizer was trained with), on a
   ModelProto rebuilt from the GGUF's vocabulary through the `sentencepiece_model_pb2` module the
   package ships: every piece with its score and type (NORMAL, CONTROL, USER_DEFINED, BYTE; the
   unknown-token id, CONTROL in the GGUF, becomes the one UNKNOWN piece sentencepiece requires),
   model type BPE, byte_fallback on, no normalization rule ("identity", empty charsmap),
   add_dummy_prefix off, remove_extra_whitespaces off, escape_whitespaces on (' ' -> U+2581).
   Two adjustments undo what the GGUF converter did or what sentencepiece leaves to its caller:
   - llama.cpp's converter wrote user-defined pieces with U+2581 turned into ' ' ("  " is id
     138); sentencepiece matches user-defined pieces after whitespace escaping, so they go back
     to U+2581 here (the 30 runs of spaces are the only ones affected).
   - sentencepiece never parses control tokens in its input, while llama.cpp does
     (parse_special = true): this script splits the text on control-token texts first
     (leftmost, longest at a position, by `re`), encodes the pieces between them with
     sentencepiece, and puts each control token's id in its place. BOS (2) is prepended.
   This is the PRIMARY source of the expected ids.

2. transformers' own GGUF -> `tokenizers` conversion (`integrations.gguf.gguf_tokenizer_mapping.
   convert_gguf_tokenizer("gemma3", ...)`, i.e. `gemma_tokenizer`: a `tokenizers` BPE whose merges
   are rebuilt from the vocabulary, ranked by token position, which for Gemma's normal tokens is
   the same order as their scores), the tokenizer the shared reference also checked llama.cpp
   against. BOS is prepended here too. The script stops if it disagrees with sentencepiece on
   any text but one kind: a run of more than 31 spaces. The longest space token is 31 spaces;
   llama.cpp matches special tokens longest first, so 33 spaces are 31 + 2 (ids 167, 138), and
   sentencepiece's leftmost-longest matching of user-defined pieces gives the same, but
   `tokenizers`' added-token matching gives 16 + 17 (152, 153), and 63 spaces 16 + 16 + 31
   instead of 31 + 31 + a plain space. That is a difference between transformers and llama.cpp,
   so there the committed ids are sentencepiece's; transformers' are kept beside them as
   `transformers_ids` (the `space_runs` text, one table row in `long_docs` and the random texts
   with a 33-space piece). For those texts the script checks that the two agree once every run
   of more than 31 spaces is cut to 31, so the runs are the only difference.

3. llama.cpp itself, when `llama_cpp` can be imported: llama-cpp-python 0.3.36, built from its
   sdist, which vendors llama.cpp 0c1e57098bba (the commit `src/tokenizer/spm.rs` cites; about
   20 minutes to build on one core):

       CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF" CMAKE_BUILD_PARALLEL_LEVEL=1 \
           python3 -m pip install --no-deps llama-cpp-python==0.3.36
       python3 -m pip install diskcache==5.6.3 jinja2==3.1.6

   `Llama(path, vocab_only=True).tokenize(text, add_bos=True, special=True)` is
   `llama_tokenize(add_special = true, parse_special = true)`; the script stops unless it gives
   sentencepiece's ids on every text. The committed file was made with it (its version is under
   "tokenizers" in the JSON; without it the script says so and leaves it out).

The texts: the public prompt, the reference's two perplexity paragraphs, whitespace runs and
edges, newlines and tabs, indented code, accents, curly quotes, emoji and CJK (byte fallback),
control characters, chat and HTML special tokens, the empty string, one character, and a long
text: the first 20,000 bytes or so (cut at a line end) of docs/*.md concatenated in name order
(the text is stored in the JSON, so the test does not read docs/); then 200 texts strung at
random (seeded) from pieces of those kinds, HTML and control tokens, a literal `<0x41>`,
zero-width and no-break spaces, a combining ring, ligatures. `round_trip` is true for
texts that contain no control-token text: decoding their ids (control tokens decode to nothing)
must give the text back.
"""

import glob
import hashlib
import json
import os
import random
import re
import sys
import tempfile

import gguf
import sentencepiece
import tokenizers
import transformers
from sentencepiece import sentencepiece_model_pb2 as pb
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

try:
    import llama_cpp
except ImportError:
    llama_cpp = None

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../.."))
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

CODE = '''def mean(values):
    """The arithmetic mean."""
    if not values:
        return 0.0
    total = 0
    for v in values:
        total += v
    return total / len(values)
'''


def long_text():
    parts = [open(p, encoding="utf-8").read() for p in sorted(glob.glob(os.path.join(ROOT, "docs/*.md")))]
    text = "".join(parts)
    cut = text.encode("utf-8")[:20000].decode("utf-8", errors="ignore")
    return cut[: cut.rfind("\n") + 1]


def texts():
    with open(os.path.join(ROOT, "../shared/reference/real-models/gemma3/public.json"), encoding="utf-8") as f:
        public = json.load(f)
    baker, eiffel = (p["text"] for p in public["perplexity"])
    return [
        ("public", "The capital of France is"),
        ("perplexity_baker", baker),
        ("perplexity_eiffel", eiffel),
        ("double_space", "Hello  world"),
        ("triple_and_quadruple_space", "one   two    three"),
        ("leading_trailing_spaces", "  leading and trailing  "),
        ("single_leading_space", " leading"),
        ("single_trailing_space", "trailing "),
        ("only_spaces", "     "),
        ("space_runs", "x" + " " * 33 + "y" + " " * 63 + "z"),
        ("newline", "\n"),
        ("two_newlines", "\n\n"),
        ("two_tabs", "\t\t"),
        ("lines", "first line\nsecond line\n\nthird paragraph\n"),
        ("mixed_whitespace", "a \t b\n \n\tc  \n"),
        ("code", CODE),
        ("accents", "Crème brûlée, naïve café, Ærøskøbing, São Paulo, Dvořák, Łódź, Ελληνικά"),
        ("curly_quotes", "\u201cHello,\u201d she said \u2014 \u2018it\u2019s fine\u2019\u2026"),
        ("emoji", "I \u2764\ufe0f Rust \U0001f980\U0001f680, \U0001f469\u200d\U0001f4bb and \U0001fae0!"),
        ("cjk", "日本語のテキスト。中文字符测试。한국어 텍스트. 𠜎𠜱𪚥"),
        ("control_characters", "a\x00b\x01c\x07d\x1be\x7ff\r\ng\x0bh\x0ci"),
        ("digits", "3.14159, 2^20 = 1048576 and 0x7F"),
        ("chat_turn", "<start_of_turn>user\nhi<end_of_turn>"),
        ("chat_two_turns", "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>"),
        ("html_tags", "<b>bold</b> and <table>"),
        ("empty", ""),
        ("single_character", "a"),
        ("long_docs", long_text()),
    ] + random_mixes(200)


# Pieces of the kinds above, strung together at random (seeded; the texts are stored anyway).
ATOMS = [
    "the", "The", " ", "  ", "   ", " " * 33, "\n", "\n\n", "\t", "\t\t", "a", "é", "ñ", "日本", "中文",
    "😀", "👩\u200d💻", "🦀", ",", ".", "!", "?", "'", '"', "“", "”", "—", "…", "<b>", "</b>",
    "<table>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<unused5>", "[multimodal]", "<", ">",
    "0x", "<0x41>", "\x00", "\x01", "\x7f", "\r", "123", "4567", "def", "return", "__init__",
    "ing", "tion", "Zürich", "𠜎", "\u200b", "\ufeff", "ﬁ", "A\u030a", "ß", "İ", "\u00a0", "\u3000",
    "€", "http://x.com/a?b=c", "{", "}", "()", "->",
]


def random_mixes(count):
    rng = random.Random(0)
    return [(f"random_mix_{i:03}", "".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 40)))) for i in range(count)]


def read_vocab(path):
    reader = gguf.GGUFReader(path)
    f = reader.fields
    assert f["tokenizer.ggml.model"].contents() == "llama"
    tokens = f["tokenizer.ggml.tokens"].contents()
    scores = f["tokenizer.ggml.scores"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == len(scores) == len(types)
    meta = {
        "bos": f["tokenizer.ggml.bos_token_id"].contents(),
        "eos": f["tokenizer.ggml.eos_token_id"].contents(),
        "unk": f["tokenizer.ggml.unknown_token_id"].contents(),
        "pad": f["tokenizer.ggml.padding_token_id"].contents(),
        "add_bos": f["tokenizer.ggml.add_bos_token"].contents(),
        "add_eos": f["tokenizer.ggml.add_eos_token"].contents(),
        "add_space_prefix": f["tokenizer.ggml.add_space_prefix"].contents(),
    }
    assert meta["add_bos"] and not meta["add_eos"] and not meta["add_space_prefix"], meta
    return tokens, scores, types, meta


def sentencepiece_encoder(tokens, scores, types, meta):
    m = pb.ModelProto()
    t = m.trainer_spec
    t.model_type = pb.TrainerSpec.BPE
    t.vocab_size = len(tokens)
    t.byte_fallback = True
    t.unk_id, t.bos_id, t.eos_id, t.pad_id = meta["unk"], meta["bos"], meta["eos"], meta["pad"]
    t.unk_piece, t.bos_piece = tokens[meta["unk"]], tokens[meta["bos"]]
    t.eos_piece, t.pad_piece = tokens[meta["eos"]], tokens[meta["pad"]]
    n = m.normalizer_spec
    n.name = "identity"
    n.precompiled_charsmap = b""
    n.add_dummy_prefix = False
    n.remove_extra_whitespaces = False
    n.escape_whitespaces = True
    kinds = {
        NORMAL: pb.ModelProto.SentencePiece.NORMAL,
        UNKNOWN: pb.ModelProto.SentencePiece.UNKNOWN,
        CONTROL: pb.ModelProto.SentencePiece.CONTROL,
        USER_DEFINED: pb.ModelProto.SentencePiece.USER_DEFINED,
        UNUSED: pb.ModelProto.SentencePiece.UNUSED,
        BYTE: pb.ModelProto.SentencePiece.BYTE,
    }
    for i, (text, score, ty) in enumerate(zip(tokens, scores, types)):
        p = m.pieces.add()
        p.piece = text.replace(" ", "\u2581") if ty == USER_DEFINED else text
        p.score = float(score)
        p.type = pb.ModelProto.SentencePiece.UNKNOWN if i == meta["unk"] else kinds[int(ty)]
    sp = sentencepiece.SentencePieceProcessor(model_proto=m.SerializeToString())
    assert sp.vocab_size() == len(tokens)

    controls = {text: i for i, (text, ty) in enumerate(zip(tokens, types)) if ty in (CONTROL, UNKNOWN)}
    pattern = re.compile("|".join(re.escape(c) for c in sorted(controls, key=len, reverse=True)))

    def encode(text):
        ids = [meta["bos"]]
        at = 0
        for match in pattern.finditer(text):
            if match.start() > at:
                ids += sp.encode(text[at : match.start()], out_type=int)
            ids.append(controls[match.group()])
            at = match.end()
        if at < len(text):
            ids += sp.encode(text[at:], out_type=int)
        return ids, bool(controls) and pattern.search(text) is None

    return encode


def transformers_encoder(tokens, scores, types, meta):
    # `AutoTokenizer.from_pretrained(..., gguf_file=...)` reads the file through a module that
    # imports torch; the conversion itself does not, so it is called on gguf-py's reading of the
    # same keys (the dictionary `get_gguf_tokenizer` builds, under its names).
    tokenizer_dict = {
        "tokenizer_type": "llama",
        "pre_tokenizer_type": "default",
        "tokens": list(tokens),
        "scores": [float(s) for s in scores],
        "token_type": [int(t) for t in types],
        "bos_token_id": meta["bos"],
        "eos_token_id": meta["eos"],
        "unk_token_id": meta["unk"],
        "pad_token_id": meta["pad"],
        "add_prefix_space": meta["add_space_prefix"],
    }
    backend, _ = convert_gguf_tokenizer("gemma3", tokenizer_dict)
    return lambda text: [meta["bos"]] + backend.encode(text, add_special_tokens=False).ids


def agree_without_long_runs(text, by_sp, by_hf):
    """Whether the two agree on `text` with every run of more than 31 spaces cut to 31."""
    shortened = re.sub(" {32,}", " " * 31, text)
    return by_sp(shortened)[0] == by_hf(shortened)


def llama_cpp_encoder(path):
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    return lambda text: llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)


def main(gguf_path, out_path):
    digest = hashlib.sha256(open(gguf_path, "rb").read()).hexdigest()
    assert digest == SHA256, digest
    tokens, scores, types, meta = read_vocab(gguf_path)
    by_sp = sentencepiece_encoder(tokens, scores, types, meta)
    by_hf = transformers_encoder(tokens, scores, types, meta)
    by_lc = llama_cpp_encoder(gguf_path) if llama_cpp else None
    if by_lc is None:
        print("llama_cpp is not installed: not checking against llama.cpp itself")
    out = []
    for name, text in texts():
        ids, round_trip = by_sp(text)
        hf = by_hf(text)
        if by_lc is not None and by_lc(text) != ids:
            sys.exit(f"{name}: llama.cpp gives {by_lc(text)[:12]}..., sentencepiece {ids[:12]}...")
        entry = {"name": name, "text": text, "round_trip": round_trip, "ids": ids}
        if hf == ids:
            print(f"{name}: {len(ids)} ids, both agree")
        elif re.search(" {32}", text) and agree_without_long_runs(text, by_sp, by_hf):
            # The one known disagreement (see the top comment): runs of more than 31 spaces.
            entry["transformers_ids"] = hf
            print(f"{name}: {len(ids)} ids; transformers differs, on runs of more than 31 spaces only")
        else:
            first = next((i for i, (a, b) in enumerate(zip(ids, hf)) if a != b), min(len(ids), len(hf)))
            sys.exit(f"{name}: sentencepiece and transformers disagree at {first}: {ids[first:first + 8]} vs {hf[first:first + 8]}")
        out.append(entry)
    if out[0]["ids"] != [2, 818, 5279, 529, 7001, 563]:
        sys.exit(f"public: {out[0]['ids']} is not the reference's [2, 818, 5279, 529, 7001, 563]")
    fixture = {
        "about": "Gemma 3 270M token ids (BOS included) as sentencepiece gives them, and llama.cpp when llama_cpp is listed under tokenizers; transformers agrees except on runs of more than 31 spaces (transformers_ids); written by make_fixture.py",
        "gguf": {"file": "gemma-3-270m-q4_k_m.gguf", "sha256": digest},
        "tokenizers": {
            "sentencepiece": sentencepiece.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            **({"llama_cpp": llama_cpp.__version__} if llama_cpp else {}),
        },
        "texts": out,
    }
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=os.path.dirname(os.path.abspath(out_path)), delete=False) as f:
        # One text per line, so a diff shows which text changed.
        head = json.dumps({k: v for k, v in fixture.items() if k != "texts"}, ensure_ascii=False, indent=1)
        lines = ",\n".join("  " + json.dumps(t, ensure_ascii=False) for t in out)
        f.write(head[:-2] + ',\n "texts": [\n' + lines + "\n ]\n}\n")
    os.chmod(f.name, 0o644)
    os.replace(f.name, out_path)
    print(f"{len(out)} texts, {sum(len(t['ids']) for t in out)} ids -> {out_path}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
