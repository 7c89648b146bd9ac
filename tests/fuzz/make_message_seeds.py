"""Writes the seed corpora of the message fuzzers: serialized GenerateRequest and
PrefillRequest messages that exercise every field, valid and invalid values alike.

Run (after a build, for the generated stubs): /usr/bin/python3 tests/fuzz/make_message_seeds.py
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("CLEAVE_BIN_DIR", os.path.join(ROOT, "build", "default", "bin"))
os.environ.setdefault("CLEAVE_SOURCE_DIR", ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import cleave_testing as ct  # noqa: E402

gen = ct.stubs()["generation_pb2"]
work = ct.stubs()["worker_pb2"]
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def sampling(**kw):
    return gen.SamplingParams(**kw)


def stopping(**kw):
    return gen.StoppingCriteria(**kw)


generate = [
    gen.GenerateRequest(text="Hello"),
    gen.GenerateRequest(token_ids=gen.TokenIds(ids=[1, 2, 3]), logprobs=5, request_id="r-1",
                        echo_prompt_token_ids=True),
    gen.GenerateRequest(text="x", sampling=sampling(temperature=0.7, top_p=0.9, top_k=40,
                                                    min_p=0.05, seed=7, repetition_penalty=1.1,
                                                    presence_penalty=0.5, frequency_penalty=-0.5),
                        stopping=stopping(max_new_tokens=16, stop=["\n\n", "END"],
                                          stop_token_ids=[2], ignore_eos=True)),
    gen.GenerateRequest(text="bad", sampling=sampling(top_p=1.5, temperature=-1),
                        stopping=stopping(min_new_tokens=9, max_new_tokens=3), logprobs=99),
    gen.GenerateRequest(model="m", text="", parse_special_tokens=True, add_special_tokens=True),
]
prefill = [
    work.PrefillRequest(request_id="a", prompt_token_ids=[1, 5, 9],
                        stopping=stopping(max_new_tokens=4)),
    work.PrefillRequest(request_id="b", prompt_token_ids=[3] * 40, logprobs=3,
                        sampling=sampling(temperature=1.3, top_k=5, top_p=0.5, min_p=0.1, seed=1,
                                          repetition_penalty=1.5, presence_penalty=1,
                                          frequency_penalty=1),
                        stopping=stopping(stop=["ab", "c"], stop_token_ids=[7, 8])),
    work.PrefillRequest(request_id="c", prompt_token_ids=[0],
                        sampling=sampling(temperature=0), stopping=stopping(ignore_eos=True)),
    work.PrefillRequest(request_id="d", prompt_token_ids=[1],
                        sampling=sampling(top_p=0, top_k=-3, repetition_penalty=0)),
]
for name, messages in (("generate_request", generate), ("worker_request", prefill)):
    os.makedirs(os.path.join(CORPUS, name), exist_ok=True)
    for i, message in enumerate(messages):
        with open(os.path.join(CORPUS, name, f"seed{i}.bin"), "wb") as f:
            f.write(message.SerializeToString())
print("seeds written")
