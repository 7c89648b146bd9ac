#!/usr/bin/env python3
"""Compares Cleave's chat-template rendering with transformers' on a folder of real model
templates (*.jinja), five conversations each (plain, system, tools with a tool call and
result, reasoning, no generation prompt). Not a test: the templates are other projects'
files and are not stored here. One source of them is llama.cpp's models/templates/, in the
llama-cpp-python source package:

  pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d /tmp/lcp
  tar xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp
  .cache/oracle-venv/bin/python tests/golden/compare_model_templates.py \
      /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates

Prints how many renderings match byte for byte, and every difference and one-sided error.
"""
import glob
import json
import os
import subprocess
import sys

from transformers.utils.chat_template_utils import render_jinja_template

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLEAVE = os.path.join(ROOT, "build", "default", "bin", "cleave")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
BOS, EOS = "<|im_start|>", "<|im_end|>"  # the SmolLM2 tokenizer's, which cleave uses

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["c", "f"]}}}}}]
CONVERSATIONS = {
    "plain": {"messages": [{"role": "user", "content": "Hello there! How are you?"}]},
    "system": {"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a river."},
        {"role": "assistant", "content": "The Danube."},
        {"role": "user", "content": "Another one, in Asia?"}]},
    "tools": {"tools": TOOLS, "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": "{\"temp\": 21}"},
        {"role": "user", "content": "Thanks!"}]},
    "reasoning": {"messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
        {"role": "user", "content": "and 3+3?"}]},
    "nogen": {"add_generation_prompt": False, "messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
}


def reference(template, conversation):
    out, _ = render_jinja_template(
        [json.loads(json.dumps(conversation["messages"]))], tools=conversation.get("tools"),
        chat_template=template,
        add_generation_prompt=conversation.get("add_generation_prompt", True),
        bos_token=BOS, eos_token=EOS)
    return out[0]


def cleave(path, conversation):
    conversation = dict(conversation)
    conversation.setdefault("add_generation_prompt", True)
    p = subprocess.run([CLEAVE, "tokenize", f"--model={MODEL}", "--chat", "--show-prompt",
                        f"--chat-template={path}", json.dumps(conversation)],
                       capture_output=True, text=True)
    return (p.stdout, None) if p.returncode == 0 else (None, p.stderr.strip()[:200])


def main():
    match, both_fail, differ, only_ours, only_theirs = 0, 0, [], [], []
    for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.jinja"))):
        template, name = open(path).read(), os.path.basename(path)
        for label, conversation in CONVERSATIONS.items():
            try:
                want, want_error = reference(template, conversation), None
            except Exception as exc:  # noqa: BLE001
                want, want_error = None, f"{type(exc).__name__}: {exc}"[:200]
            got, got_error = cleave(path, conversation)
            if want is None and got is None:
                both_fail += 1
            elif got is None:
                only_ours.append((name, label, got_error))
            elif want is None:
                only_theirs.append((name, label, want_error))
            elif want == got:
                match += 1
            else:
                i = next((k for k in range(min(len(want), len(got))) if want[k] != got[k]),
                         min(len(want), len(got)))
                around = slice(max(0, i - 40), i + 60)
                differ.append((name, label, want[around], got[around]))
    print(f"{match} renderings match; {both_fail} fail on both sides")
    print(f"{len(only_ours)} fail only in Cleave:")
    for row in only_ours:
        print("  ", *row)
    print(f"{len(only_theirs)} fail only in transformers:")
    for row in only_theirs:
        print("  ", *row)
    print(f"{len(differ)} differ:")
    for name, label, want, got in differ:
        print(f"   {name} {label}\n     transformers: {want!r}\n     cleave:       {got!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
