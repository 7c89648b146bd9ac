#!/usr/bin/env python3
"""Golden matches for the regex engine (services/engine/regex.h): for each pattern, strings
and whether Python's re.fullmatch(pattern, string, re.ASCII) matches them.

The strings are each pattern's examples, their prefixes and random edits of them
(a character inserted, deleted or replaced from the pattern's alphabet), so both answers
come up. Deterministic; writes tests/golden/data/regex/fullmatch.json.
"""
from __future__ import annotations

import json
import random
import re

from _common import DATA_DIR

# (pattern, examples that match or nearly do)
PATTERNS = [
    (r"yes|no", ["yes", "no", "maybe"]),
    (r"(?:positive|negative|neutral)", ["positive", "neutral", "negativ"]),
    (r"\d{4}-\d{2}-\d{2}", ["2026-12-04", "1999-01-31", "20261-2-04"]),
    (r"[A-Z][a-z]+ [A-Z][a-z]+", ["Ada Lovelace", "Alan Turing", "alan turing"]),
    (r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}", ["a.b@example.com", "x@y.io", "bad@x"]),
    (r"\(\d{3}\) \d{3}-\d{4}", ["(555) 123-4567", "555-123-4567"]),
    (r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?", ["0", "-12.5e+3", "01", "3.", "7E7"]),
    (r"(ab|cd)*e?", ["", "abcdab", "cde", "abc"]),
    (r"a{2,4}b{0,2}c{3}", ["aaccc", "aaaabbccc", "accc", "aaaaaccc"]),
    (r"a{3,}", ["aaa", "aaaaaaa", "aa"]),
    (r"[^aeiou\s]+", ["rhythm", "sky", "tree", "my gym"]),
    (r"\w+\s\W?", ["word ", "word !", "w\t", "x  "]),
    (r"\S+\.\S*", ["a.b", ".", "a b.c"]),
    (r"colou?r", ["color", "colour", "colouur"]),
    (r"(?P<key>[a-z]+)=(?P<value>\d+)(;[a-z]+=\d+)*", ["a=1", "ab=12;c=3", "a=;b=2"]),
    (r"^start.*end$", ["start and end", "startend", "start\nend", "start en"]),
    (r"caf\u00e9|na\u00efve", ["caf\u00e9", "na\u00efve", "cafe"]),
    (r"[\u00e0-\u00ff]+", ["\u00e0\u00e9\u00ff", "\u00df", "a\u00e9"]),
    (r"[^a-z]", ["\u00e9", "\u4e2d", "\U0001F600", "q", "Q"]),
    (r".{2}", ["\u4e2d\u6587", "ab", "\U0001F600x", "a\n"]),
    (r"\x41\u0042[\x30-\x39]", ["AB5", "AB", "ab5"]),
    (r"[-a]+[a-]*[]x]", ["-a]", "a-x", "--x", "ax"]),
    (r"[\d\-\.]+", ["1-2.3", "-", "1,2"]),
    (r"a*?b+?c??", ["abc", "bb", "aaab", "c"]),
    (r"(a|b|)c", ["c", "ac", "bc", "abc"]),
    (r"(|x)(y|)", ["", "x", "y", "xy", "yx"]),
    (r"\.\*\+\?\(\)\[\]\{\}\|\\", [".*+?()[]{}|\\", ".*+?"]),
    (r"x{2}{", ["xx{", "xx"]),
    (r"\{\"name\": \"[A-Za-z ]{1,20}\", \"age\": \d{1,3}\}",
     ['{"name": "Ada", "age": 36}', '{"name": "", "age": 1}']),
    (r"(true|false)\n?", ["true", "false\n", "True"]),
    (r"x{,3}y{,}", ["xxxy{,}", "y{,}", "xxxxy{,}", "xy"]),
]


def alphabet(examples: list[str]) -> list[str]:
    chars = sorted({c for e in examples for c in e} | set("a0 -.\n"))
    return chars


def cases(pattern: str, examples: list[str], rng: random.Random) -> list[tuple[str, bool]]:
    chars = alphabet(examples)
    strings = set()
    for e in examples:
        strings.add(e)
        for i in range(len(e)):
            strings.add(e[:i])
        for _ in range(12):
            s = list(e)
            op = rng.randrange(3)
            i = rng.randrange(len(s) + 1)
            if op == 0:
                s.insert(i, rng.choice(chars))
            elif op == 1 and s:
                del s[min(i, len(s) - 1)]
            elif s:
                s[min(i, len(s) - 1)] = rng.choice(chars)
            strings.add("".join(s))
    compiled = re.compile(pattern, re.ASCII)
    return [(s, compiled.fullmatch(s) is not None) for s in sorted(strings)]


def main() -> None:
    rng = random.Random(2026)
    out = [{"pattern": p, "cases": cases(p, ex, rng)} for p, ex in PATTERNS]
    path = DATA_DIR / "regex" / "fullmatch.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    total = sum(len(o["cases"]) for o in out)
    matches = sum(m for o in out for _, m in o["cases"])
    print(f"{path}: {len(out)} patterns, {total} strings, {matches} matching")


if __name__ == "__main__":
    main()
