"""Tokenizer test corpus for the Cleave goldens.

CORPUS is a list of (tag, bytes). The tag is a short stable label used in the
golden files; the bytes are the exact input. Items whose bytes are not valid
UTF-8 are deliberate (see is_valid_utf8); only the GGUF/llama.cpp goldens use
them, since tokenizer.json pipelines take str.
"""
from __future__ import annotations

CORPUS: list[tuple[str, bytes]] = [
    # --- empty and single characters
    ("empty", b""),
    ("char_a", b"a"),
    ("char_space", b" "),
    ("char_newline", b"\n"),
    ("char_digit", b"7"),
    ("char_euro", "\u20ac".encode()),
    ("char_emoji", "\U0001F600".encode()),
    # --- plain English
    ("en_hello", b"Hello world"),
    ("en_hello_lead_space", b" Hello world"),
    ("en_sentence", b"The quick brown fox jumps over the lazy dog."),
    ("en_question", b"Why do birds suddenly appear, every time you are near?"),
    ("en_caps", b"THIS IS SHOUTING, and this is not. MiXeD CaSe WoRdS."),
    ("en_paragraph",
     b"Serving a language model well is mostly about keeping the accelerator busy. "
     b"Requests arrive at random, their prompts differ in length, and each one produces "
     b"tokens at its own pace.\nA scheduler that batches them continuously, pages the "
     b"key-value cache, and reuses shared prefixes can multiply throughput without "
     b"hurting latency much."),
    ("en_punct", b"Wait... what?! (Really) [yes] {no} <maybe> \"quoted\" 'single' -- dash; colon: end."),
    # --- contractions
    ("contr_dont", b"don't"),
    ("contr_mix", b"I'LL go, they're here, we've won, she'd say, it's fine, I'm done"),
    ("contr_upper", b"DON'T WON'T CAN'T SHOULDN'T"),
    ("contr_curly", "it\u2019s they\u2019re".encode()),
    # --- digits and numbers
    ("num_long", b"12345678901234567890"),
    ("num_pi", b"3.14159"),
    ("num_million", b"1,000,000"),
    ("num_phone", b"+1 (555) 010-9999 ext. 42"),
    ("num_mixed", b"abc123def 4567 89x 0.5e-10 2024-06-11 12:34:56"),
    ("num_fullwidth", "\uff11\uff12\uff13 \u0661\u0662\u0663 \u0967\u0968".encode()),
    # --- source code
    ("code_python",
     b"def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
     b"print([fib(i) for i in range(10)])  # first ten\n"),
    ("code_cpp",
     b"#include <vector>\n\ntemplate <typename T>\nT sum(const std::vector<T>& v) {\n"
     b"\tT acc{};\n\tfor (auto x : v) {\n\t\tacc += x;\n\t}\n\treturn acc;\n}\n"),
    ("code_json",
     b'{"model": "smollm2", "max_tokens": 128, "temperature": 0.7, "stop": ["\\n\\n"], '
     b'"messages": [{"role": "user", "content": "hi"}], "stream": true, "n": null}'),
    ("code_shell", b"$ ls -la /tmp && echo \"done\" | tee -a log.txt 2>&1\n"),
    ("code_rust_ops", b"let x = a<<2 | b>>3; if x != 0 && y >= 1 { z += 1; } // ok"),
    # --- whitespace runs
    ("ws_spaces", b"a          b"),
    ("ws_only_spaces", b"        "),
    ("ws_tabs", b"\t\tindented\twith\ttabs\t\t"),
    ("ws_newlines", b"line1\n\n\nline4\n"),
    ("ws_crlf", b"windows\r\nline\r\nends\r\n"),
    ("ws_mixed", b" \t \n \r\n\t  mixed \n\t whitespace \t\n  "),
    ("ws_trailing", b"trailing spaces   "),
    ("ws_leading", b"   leading spaces"),
    ("ws_many_newlines", b"\n\n\n\n\n\n\n\n"),
    ("ws_nbsp", "no\u00a0break\u2003em\u3000ideo".encode()),
    # --- CJK
    ("zh", "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002".encode()),
    ("ja", "\u3053\u3093\u306b\u3061\u306f\u3001\u4e16\u754c\uff01\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3002".encode()),
    ("ko", "\uc548\ub155\ud558\uc138\uc694, \uc138\uacc4! \ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4.".encode()),
    # --- other scripts
    ("ar", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645\u060c \u0643\u064a\u0641 \u062d\u0627\u0644\u0643\u061f".encode()),
    ("hi", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e, \u0906\u092a \u0915\u0948\u0938\u0947 \u0939\u0948\u0902?".encode()),
    ("ru", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u042d\u0442\u043e \u0442\u0435\u0441\u0442 \u041a\u0418\u0420\u0418\u041b\u041b\u0418\u0426\u042b.".encode()),
    ("el", "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5".encode()),
    ("he", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd".encode()),
    ("th", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01".encode()),
    ("mixed_scripts", "Hello \u4e16\u754c \u043c\u0438\u0440 \u0639\u0627\u0644\u0645 \U0001F30D 123 caf\u00e9".encode()),
    # --- combining marks and normalization traps
    ("comb_e_acute", "e\u0301".encode()),
    ("comb_word", "cafe\u0301 vs caf\u00e9".encode()),
    ("comb_stack", "a\u0300\u0301\u0302\u0303\u0304 Z\u0351\u036b\u0343\u036a".encode()),
    ("ligature_fi", "\ufb01le \u2126 \u212b".encode()),
    # --- emoji
    ("emoji_simple", "I \u2764\ufe0f pizza \U0001F355!".encode()),
    ("emoji_zwj_family", "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466".encode()),
    ("emoji_skin", "\U0001F44D\U0001F3FB \U0001F44D\U0001F3FF \U0001F9D1\U0001F3FD\u200d\U0001F4BB".encode()),
    ("emoji_flags", "\U0001F1FA\U0001F1F8 \U0001F1EF\U0001F1F5 \U0001F1E9\U0001F1EA \U0001F3F4\u200d\u2620\ufe0f".encode()),
    ("emoji_run", "\U0001F600\U0001F603\U0001F604\U0001F601\U0001F606\U0001F605\U0001F602\U0001F923".encode()),
    ("emoji_keycap", "1\ufe0f\u20e3 #\ufe0f\u20e3".encode()),
    # --- special-token look-alikes (plain text unless a tokenizer registers them)
    ("sp_im_start", b"<|im_start|>"),
    ("sp_endoftext", b"<|endoftext|>"),
    ("sp_s", b"<s>"),
    ("sp_s_close", b"</s>"),
    ("sp_chat", b"<|im_start|>user\nhi<|im_end|>"),
    ("sp_chat_full",
     b"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
     b"<|im_start|>assistant\n"),
    ("sp_llama3", b"<|begin_of_text|>Hi<|end_of_text|>"),
    ("sp_unk", b"<unk> and <s>text</s>"),
    ("sp_broken", b"<|im_start user <|im_end| <|endoftext"),
    ("sp_embedded", b"before<|endoftext|>after"),
    # --- URLs, paths, mixed
    ("url", b"https://example.com/path/to/page?query=1&lang=en#section-2"),
    ("email", b"Contact: first.last+tag@example.org"),
    ("path_windows", b"C:\\Users\\cleave\\models\\weights.bin"),
    ("markdown", b"# Title\n\n- item **bold** _it_ `code`\n\n```\nx = 1\n```\n"),
    ("repeat_chars", b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
    ("repeat_dashes", b"----------====================__________"),
    ("latin_accents", "\u00c0 la cr\u00e8me br\u00fbl\u00e9e, na\u00efve fa\u00e7ade, \u00c5ngstr\u00f6m, \u0141\u00f3d\u017a".encode()),
    ("symbols", "\u00a9 \u00ae \u2122 \u00b0 \u00b1 \u00d7 \u00f7 \u2260 \u2264 \u2265 \u221e \u2211 \u222b \u221a \u2192 \u21d2".encode()),
    ("control_chars", b"bell\x07 tab\t nul\x00 esc\x1b[0m del\x7f"),
    ("bom_prefix", "\ufeffBOM at start".encode()),
    ("private_use", "\ue000\uf8ff".encode()),
    ("astral_math", "\U0001D400\U0001D401 \U0001D7D8".encode()),
    # --- invalid UTF-8 (byte-level only)
    ("bad_lone_continuation", b"abc\x80def"),
    ("bad_truncated_3byte", b"caf\xe2\x82"),
    ("bad_ff", b"\xff"),
    ("bad_mixed", b"ok \xc3\x28 then \xf0\x9f\x98 end \xfe\xfe"),
    ("bad_overlong", b"\xc0\xafslash"),
    ("bad_surrogate", b"\xed\xa0\x80x"),
]


def is_valid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8", errors="strict")
        return True
    except UnicodeDecodeError:
        return False


VALID = [(t, b) for t, b in CORPUS if is_valid_utf8(b)]
INVALID = [(t, b) for t, b in CORPUS if not is_valid_utf8(b)]

assert len({t for t, _ in CORPUS}) == len(CORPUS), "duplicate tags"
