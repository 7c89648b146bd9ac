"""Training text for the small tokenizers built by gen_tokenizers.py.

Written for this project. Together with the valid items of tokenizer_corpus it
is the whole training input, so the trained vocabularies are reproducible.
"""
from __future__ import annotations

PROSE = """\
A serving system for language models sits between many impatient clients and one very expensive
machine. Every request carries a prompt, a few sampling settings and a limit on how many tokens it
may produce. The system reads the prompt, turns it into token ids, runs the model over those ids
once to fill the attention cache, and then produces one new token at a time until the request
finishes. Each of those steps has its own cost, and the art is in overlapping them.

The first step, tokenization, looks trivial and is not. Text arrives as bytes. Some of those bytes
are not valid UTF-8, some are invisible control characters, and some look exactly like the special
markers a chat template uses to separate the system prompt from the user's words. A tokenizer must
split the text into pre-tokens, apply its merges in the right order, and map the result to ids that
match the ones the model saw during training. A single id off by one changes every probability that
follows.

The second step, prefill, is dominated by large matrix multiplications. The prompt's tokens are
processed together, so the accelerator stays busy and the work is limited by arithmetic. The third
step, decoding, is the opposite: each sequence contributes a single token, the weights are read
from memory again and again, and the work is limited by memory bandwidth. Batching many sequences
together is what makes decoding affordable.

Continuous batching lets new requests join a running batch as soon as old ones leave. Paged
attention stores the cache in fixed-size blocks so that sequences of different lengths do not
fragment memory. Prefix caching notices when two prompts share a beginning, such as a long system
prompt, and reuses the blocks that were already computed. Speculative decoding guesses several
tokens with a cheap draft model and checks them with the large one in a single pass.

Quantization shrinks the weights. Eight-bit formats keep one scale per block of thirty-two values;
four-bit formats add a minimum or use super-blocks of two hundred and fifty-six values with six-bit
sub-scales. The file that stores them records, for every tensor, its name, its shape, its type and
where its bytes begin. A reader that gets any of those wrong produces a model that still runs but
answers nonsense, which is the worst kind of bug because nothing crashes.

Testing such a system means comparing it with trusted references. For the tokenizer, the reference
encodes a fixed list of tricky strings and the system must produce the same ids. For dequantization,
the reference expands random blocks into floats and the system must match them bit for bit. For the
configuration files, the reference reads each field and the system must derive the same head size,
the same number of key and value heads, and the same rotary embedding settings.

Numbers deserve special care: 0, 1, 2, 3, 10, 42, 100, 256, 1024, 4096, 65536, 3.14, 2.718, 1e-5,
-7, +12, 1,234,567 and 2024-01-31 all appear in real prompts. So do dates like March 3rd, times like
10:45 PM, prices like $19.99 and EUR 5,00, percentages like 12.5% and versions like v1.2.3-rc4.

People write in many styles. They say "I'm sure", "you're right", "we'll see", "it's late", "don't
worry", "they've gone" and "he'd know". They SHOUT sometimes. They use tabs\tand  double  spaces,
trailing spaces   , and blank lines.


They paste URLs such as https://docs.example.net/guide/install.html?os=linux and e-mail addresses
such as team@example.com. They mix languages: bonjour, hola, ciao, hallo, privet, konnichiwa.
"""

CODE = """\
import json
import os
from dataclasses import dataclass, field


@dataclass
class Request:
    request_id: str
    prompt: str
    max_tokens: int = 256
    temperature: float = 1.0
    stop: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"id": self.request_id, "prompt": self.prompt,
                           "max_tokens": self.max_tokens, "temperature": self.temperature})


def load_requests(path: str) -> list[Request]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            data = json.loads(line)
            out.append(Request(data["id"], data["prompt"], data.get("max_tokens", 256)))
    return out


class Scheduler:
    def __init__(self, max_batch: int = 32) -> None:
        self.max_batch = max_batch
        self.waiting: list[Request] = []
        self.running: list[Request] = []

    def step(self) -> int:
        while self.waiting and len(self.running) < self.max_batch:
            self.running.append(self.waiting.pop(0))
        return len(self.running)
"""

CPP = """\
#include <cstdint>
#include <string>
#include <vector>

namespace cleave {

struct BlockTable {
\tstd::vector<int32_t> blocks;
\tint32_t tokens = 0;

\tint32_t capacity(int32_t block_size) const {
\t\treturn static_cast<int32_t>(blocks.size()) * block_size;
\t}
};

inline float dequant_q8_0(const uint8_t* block, int i) {
\tconst float d = half_to_float(*reinterpret_cast<const uint16_t*>(block));
\tconst int8_t* qs = reinterpret_cast<const int8_t*>(block + 2);
\treturn d * static_cast<float>(qs[i]);
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
\tstd::string out;
\tfor (size_t i = 0; i < parts.size(); ++i) {
\t\tif (i != 0) out += sep;
\t\tout += parts[i];
\t}
\treturn out;
}

}  // namespace cleave
"""

DATA = """\
{"id": "req-0001", "prompt": "Summarize the following text.", "max_tokens": 64, "stream": false}
{"id": "req-0002", "prompt": "Translate to French: good morning", "max_tokens": 16, "stream": true}
{"id": "req-0003", "prompt": "Write a haiku about GPUs.", "max_tokens": 32, "temperature": 0.9}
name,tokens,latency_ms,throughput
prefill,512,41.7,12278.3
decode,1,8.2,121.9
decode,1,8.4,119.0
<html><head><title>Status</title></head><body><p>All systems nominal.</p></body></html>
"""

MULTI = """\
\u6a21\u578b\u63a8\u7406\u670d\u52a1\u9700\u8981\u9ad8\u541e\u5410\u91cf\u548c\u4f4e\u5ef6\u8fdf\u3002\u6211\u4eec\u4f7f\u7528\u5206\u9875\u6ce8\u610f\u529b\u548c\u8fde\u7eed\u6279\u5904\u7406\u3002
\u8a00\u8a9e\u30e2\u30c7\u30eb\u306e\u63a8\u8ad6\u306f\u30e1\u30e2\u30ea\u5e2f\u57df\u5e45\u306b\u5236\u7d04\u3055\u308c\u307e\u3059\u3002\u30c8\u30fc\u30af\u30f3\u3092\u4e00\u3064\u305a\u3064\u751f\u6210\u3057\u307e\u3059\u3002
\uc5b8\uc5b4 \ubaa8\ub378 \uc11c\ube59\uc740 \ubc30\uce58 \ucc98\ub9ac\uac00 \uc911\uc694\ud569\ub2c8\ub2e4. \ud1a0\ud070\uc744 \ud558\ub098\uc529 \uc0dd\uc131\ud569\ub2c8\ub2e4.
\u042f\u0437\u044b\u043a\u043e\u0432\u0430\u044f \u043c\u043e\u0434\u0435\u043b\u044c \u0433\u0435\u043d\u0435\u0440\u0438\u0440\u0443\u0435\u0442 \u0442\u0435\u043a\u0441\u0442 \u043f\u043e \u043e\u0434\u043d\u043e\u043c\u0443 \u0442\u043e\u043a\u0435\u043d\u0443 \u0437\u0430 \u0440\u0430\u0437.
\u0627\u0644\u0646\u0645\u0648\u0630\u062c \u064a\u0648\u0644\u062f \u0627\u0644\u0646\u0635 \u0631\u0645\u0632\u0627 \u0628\u0639\u062f \u0631\u0645\u0632.
\u092e\u0949\u0921\u0932 \u090f\u0915 \u0938\u092e\u092f \u092e\u0947\u0902 \u090f\u0915 \u091f\u094b\u0915\u0928 \u092c\u0928\u093e\u0924\u093e \u0939\u0948\u0964
Caf\u00e9 cr\u00e8me, na\u00efve r\u00e9sum\u00e9, Stra\u00dfe, \u00e5ngstr\u00f6m, se\u00f1or, \u0142\u00f3d\u017a.
\U0001F600 \U0001F680 \U0001F4A1 \u2705 \u274c \U0001F44D \U0001F525 \u2764\ufe0f
"""

TRAIN_TEXT = "\n".join([PROSE, CODE, CPP, DATA, MULTI])
